#include "client/parallel_copy.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

// Regions of sizes around the 32 MiB piece size, tails of odd lengths and an
// empty one, copied with 1 to 5 threads, land byte-exact where they belong and
// nothing around them is touched.
TEST(ParallelHostCopyTest, EveryRegionLandsExactlyWithAnyThreadCount) {
  const uint64_t seed = testing::TestSeed();
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
