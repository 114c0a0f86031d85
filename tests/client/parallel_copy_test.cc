#include "client/parallel_copy.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "snapshot/chunk_codec.h"

namespace ckpt::client {
namespace {

// Regions of sizes around the 32 MiB piece size, tails of odd lengths and an
// empty one, copied with 1 to 5 threads, land byte-exact where they belong and
// nothing around them is touched.
TEST(ParallelHostCopyTest, EveryRegionLandsExactlyWithAnyThreadCount) {
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937_64 rng(seed);
  const std::vector<size_t> sizes = {
      0, 1, 4095, (size_t{32} << 20) + 3, (size_t{64} << 20) - 1, 12345};
  size_t total = 0;
  for (size_t s : sizes) total += s + 64;  // guard bytes between regions
  std::vector<uint8_t> src(total), dst(total);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (int threads = 1; threads <= 5; ++threads) {
    std::fill(dst.begin(), dst.end(), 0xAB);
    std::vector<CopyRegion> regions;
    size_t off = 0;
    for (size_t s : sizes) {
      regions.push_back({src.data() + off, dst.data() + off, s});
      off += s + 64;
    }
    ParallelHostCopy(regions, threads);
    off = 0;
    for (size_t s : sizes) {
      ASSERT_EQ(0, std::memcmp(src.data() + off, dst.data() + off, s))
          << "region of " << s << " bytes, " << threads << " threads";
      for (size_t g = 0; g < 64; ++g) {
        ASSERT_EQ(dst[off + s + g], 0xAB) << "guard after " << s << " bytes";
      }
      off += s + 64;
    }
  }
}

// A region that asks for hashes gets one per chunk of what landed, the last
// one shorter; regions beside it are copied as before.
TEST(ParallelHostCopyTest, HashedRegionsGetTheHashOfEachChunkCopied) {
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937_64 rng(seed);
  constexpr size_t kChunk = size_t{1} << 20;
  const std::vector<size_t> sizes = {3 * kChunk + 17, kChunk, 5, 0};
  for (int threads = 1; threads <= 3; ++threads) {
    for (size_t size : sizes) {
      std::vector<uint8_t> src(size), dst(size), plain_src(999), plain(999);
      for (auto& b : src) b = static_cast<uint8_t>(rng());
      for (auto& b : plain_src) b = static_cast<uint8_t>(rng());
      const size_t chunks = (size + kChunk - 1) / kChunk;
      std::vector<uint64_t> hashes(chunks, 0);
      ParallelHostCopy({{src.data(), dst.data(), size, hashes.data(), kChunk},
                        {plain_src.data(), plain.data(), plain.size()}},
                       threads);
      ASSERT_EQ(src, dst);
      ASSERT_EQ(plain_src, plain);
      for (size_t c = 0; c < chunks; ++c) {
        const size_t n = std::min(kChunk, size - c * kChunk);
        EXPECT_EQ(hashes[c], snapshot::Checksum(absl::MakeConstSpan(
                                 src.data() + c * kChunk, n)))
            << "chunk " << c << " of " << size << " bytes, " << threads
            << " threads";
      }
    }
  }
}

TEST(ParallelHostCopyTest, ThreadsFollowTheSizeAndTheEnvironment) {
  ::unsetenv("CKPT_COPY_THREADS");
  EXPECT_EQ(CopyThreadsFor(1 << 20), 1);
  EXPECT_GE(CopyThreadsFor(size_t{1} << 30), 1);
  EXPECT_LE(CopyThreadsFor(size_t{1} << 30), 8);
  ::setenv("CKPT_COPY_THREADS", "3", 1);
  EXPECT_EQ(CopyThreadsFor(1 << 20), 3);
  ::unsetenv("CKPT_COPY_THREADS");
}

}  // namespace
}  // namespace ckpt::client
