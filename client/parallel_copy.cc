#include "client/parallel_copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/types/span.h"
#include "snapshot/chunk_codec.h"

namespace ckpt::client {
namespace {

constexpr size_t kPiece = size_t{32} << 20;
constexpr int kMaxThreads = 8;
// A block copied then hashed while it is still in the core's cache (a
// quarter of a typical 1-2 MiB L2).
constexpr size_t kHashBlock = size_t{256} << 10;

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
  std::vector<CopyRegion> pieces;
  for (const CopyRegion& r : regions) {
    for (size_t off = 0; off < r.bytes; off += kPiece) {
      pieces.push_back({static_cast<const char*>(r.src) + off,
                        static_cast<char*>(r.dst) + off,
                        std::min(kPiece, r.bytes - off)});
    }
  }
  io::ParallelFor(pieces.size(), threads, [&pieces](size_t i) {
    std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].bytes);
  });
}

uint64_t CopyAndChecksum(void* dst, const void* src, size_t bytes) {
  auto* to = static_cast<uint8_t*>(dst);
  const auto* from = static_cast<const uint8_t*>(src);
  snapshot::ChecksumStream hash;
  for (size_t at = 0; at < bytes; at += kHashBlock) {
    const size_t n = std::min(kHashBlock, bytes - at);
    std::memcpy(to + at, from + at, n);
    hash.Update(absl::MakeConstSpan(to + at, n));
  }
  return hash.Digest();
}

void ParallelCopyAndHash(const std::vector<HashedCopyRegion>& regions,
                         uint32_t chunk_size, int threads) {
  struct Run {
    const uint8_t* src;
    uint8_t* dst;
    size_t bytes;
    uint64_t* xxh3;
  };
  std::vector<Run> runs;
  for (const HashedCopyRegion& r : regions) {
    for (size_t off = 0, k = 0; off < r.bytes; off += chunk_size, ++k) {
      runs.push_back({static_cast<const uint8_t*>(r.src) + off,
                      static_cast<uint8_t*>(r.dst) + off,
                      std::min<size_t>(chunk_size, r.bytes - off), r.xxh3 + k});
    }
  }
  io::ParallelFor(runs.size(), threads, [&runs](size_t i) {
    *runs[i].xxh3 = CopyAndChecksum(runs[i].dst, runs[i].src, runs[i].bytes);
  });
}

}  // namespace ckpt::client
