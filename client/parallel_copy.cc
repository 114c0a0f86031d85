#include "client/parallel_copy.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/types/span.h"
#include "snapshot/chunk_codec.h"

namespace ckpt::client {
namespace {

constexpr size_t kPiece = size_t{32} << 20;
constexpr int kMaxThreads = 8;

}  // namespace

int CopyThreadsFor(size_t total_bytes) {
  if (const char* env = std::getenv("CKPT_COPY_THREADS");
      env != nullptr && *env != '\0') {
    return std::clamp(std::atoi(env), 1, 64);
  }
  const int cores =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int pieces = static_cast<int>(
      std::min<size_t>(kMaxThreads, std::max<size_t>(1, total_bytes / kPiece)));
  return std::min({cores, kMaxThreads, pieces});
}

void ParallelHostCopy(const std::vector<CopyRegion>& regions, int threads) {
  // A hashed region is split at its chunks (one hash each); others in pieces.
  std::vector<CopyRegion> pieces;
  for (const CopyRegion& r : regions) {
    const bool hashed = r.chunk_xxh3 != nullptr && r.chunk_size > 0;
    const size_t piece = hashed ? r.chunk_size : kPiece;
    for (size_t off = 0, k = 0; off < r.bytes; off += piece, ++k) {
      pieces.push_back({static_cast<const char*>(r.src) + off,
                        static_cast<char*>(r.dst) + off,
                        std::min(piece, r.bytes - off),
                        hashed ? r.chunk_xxh3 + k : nullptr});
    }
  }
  ParallelFor(pieces.size(), threads, [&pieces](size_t i) {
    const CopyRegion& p = pieces[i];
    std::memcpy(p.dst, p.src, p.bytes);
    if (p.chunk_xxh3 != nullptr) {
      *p.chunk_xxh3 = snapshot::Checksum(
          absl::MakeConstSpan(static_cast<const uint8_t*>(p.dst), p.bytes));
    }
  });
}

void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&fn, &next, n] {
    for (size_t i = next++; i < n; i = next++) fn(i);
  };
  threads = std::clamp<int>(threads, 1, std::max<size_t>(1, n));
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
}

}  // namespace ckpt::client
