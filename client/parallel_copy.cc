#include "client/parallel_copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

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

}  // namespace ckpt::client
