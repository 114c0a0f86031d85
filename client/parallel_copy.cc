#include "client/parallel_copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "absl/types/span.h"
#include "snapshot/chunk_codec.h"

namespace ckpt::client {
namespace {

constexpr size_t kPiece = size_t{32} << 20;
constexpr int kMaxThreads = 8;
// A block copied then hashed while it is still in the core's cache (a
// quarter of a typical 1-2 MiB L2).
constexpr size_t kHashBlock = size_t{256} << 10;
// Runs this long or longer are copied with streaming stores (a run far from
// filling a cache gains nothing from bypassing it).
constexpr size_t kStreamingFrom = size_t{64} << 10;

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

bool StreamingStores() {
#if defined(__x86_64__)
  static const bool on = [] {
    const char* env = std::getenv("CKPT_COPY_STREAMING");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return on;
#else
  return false;
#endif
}

void StreamingCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* to = static_cast<uint8_t*>(dst);
  const auto* from = static_cast<const uint8_t*>(src);
  // Up to the destination's first 16-byte boundary, and the tail, as usual.
  const size_t head = std::min<size_t>(
      bytes, (16 - (reinterpret_cast<uintptr_t>(to) & 15)) & 15);
  std::memcpy(to, from, head);
  to += head;
  from += head;
  bytes -= head;
  // A cache line per round: four unaligned loads, four streaming stores.
  for (; bytes >= 64; bytes -= 64, to += 64, from += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 16));
    const __m128i c =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 32));
    const __m128i d =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(to), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(to + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(to + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(to + 48), d);
  }
  std::memcpy(to, from, bytes);
  _mm_sfence();  // the stores are seen before whatever signals their end
#else
  std::memcpy(dst, src, bytes);
#endif
}

uint64_t CopyAndChecksum(void* dst, const void* src, size_t bytes) {
  auto* to = static_cast<uint8_t*>(dst);
  const auto* from = static_cast<const uint8_t*>(src);
  snapshot::ChecksumStream hash;
  if (bytes >= kStreamingFrom && StreamingStores()) {
    // The copy bypasses the cache (no read of the destination's lines before
    // they are written, none of the source's evicted for them); the block
    // hashed is the source's, still in the cache after its loads: the bytes
    // the stores wrote.
    for (size_t at = 0; at < bytes; at += kHashBlock) {
      const size_t n = std::min(kHashBlock, bytes - at);
      StreamingCopy(to + at, from + at, n);
      hash.Update(absl::MakeConstSpan(from + at, n));
    }
    return hash.Digest();
  }
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
