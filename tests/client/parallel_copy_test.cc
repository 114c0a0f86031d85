#include "client/parallel_copy.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "snapshot/chunk_codec.h"
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

// Copy and hash in one pass gives what copying then hashing each chunk
// gives, for random region sizes, alignments (offsets into the buffers),
// chunk sizes (below, at and above the hash block) and thread counts.
TEST(ParallelCopyAndHashTest, HashesEqualHashingAfterTheCopy) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> src(size_t{24} << 20), dst(src.size() + 4096);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  const std::vector<uint32_t> chunk_sizes = {
      1, 4096, 100000, 256 << 10, (256 << 10) + 1, 1 << 20, 4 << 20};
  for (int round = 0; round < 12; ++round) {
    const uint32_t chunk = chunk_sizes[rng() % chunk_sizes.size()];
    const int threads = 1 + static_cast<int>(rng() % 5);
    std::vector<HashedCopyRegion> regions;
    std::vector<std::vector<uint64_t>> hashes;
    std::vector<std::pair<size_t, size_t>> placed;  // src offset, dst offset
    size_t src_at = 0, dst_at = 0;
    const int count = 1 + static_cast<int>(rng() % 4);
    const size_t most = chunk == 1 ? 3000 : src.size() / count - 64;
    hashes.reserve(count);
    for (int r = 0; r < count; ++r) {
      const size_t bytes = rng() % most;
      const size_t skew_src = rng() % 64, skew_dst = rng() % 64;
      src_at += skew_src;
      dst_at += skew_dst;
      hashes.emplace_back(bytes == 0 ? 0 : (bytes + chunk - 1) / chunk, 0);
      regions.push_back({src.data() + src_at, dst.data() + dst_at, bytes,
                         hashes.back().data()});
      placed.emplace_back(src_at, dst_at);
      src_at += bytes;
      dst_at += bytes;
    }
    ParallelCopyAndHash(regions, chunk, threads);
    for (size_t r = 0; r < regions.size(); ++r) {
      const size_t bytes = regions[r].bytes;
      ASSERT_EQ(0, std::memcmp(src.data() + placed[r].first,
                               dst.data() + placed[r].second, bytes))
          << "seed " << seed << " region " << r;
      for (size_t k = 0; k < hashes[r].size(); ++k) {
        const size_t off = k * chunk;
        const uint64_t want = snapshot::Checksum(
            absl::MakeConstSpan(dst.data() + placed[r].second + off,
                                std::min<size_t>(chunk, bytes - off)));
        ASSERT_EQ(hashes[r][k], want)
            << "seed " << seed << " chunk size " << chunk << " region " << r
            << " chunk " << k << ", " << threads << " threads";
      }
    }
  }
}

// Streaming stores copy exactly, whatever the alignment of either side and
// the length (the head to a 16-byte boundary, whole lines, the tail), and
// touch nothing around the destination; CopyAndChecksum's hash (streamed
// from 64 KiB) is the Checksum of what landed.
TEST(StreamingCopyTest, CopiesExactlyAtEveryAlignment) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> src((size_t{2} << 20) + 256), dst(src.size() + 256);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (int round = 0; round < 300; ++round) {
    const size_t skew_src = rng() % 64, skew_dst = rng() % 64;
    const size_t bytes =
        round < 200 ? rng() % 300 : rng() % (src.size() - 2 * 64);
    std::fill(dst.begin(), dst.end(), 0x5A);
    uint8_t* to = dst.data() + 64 + skew_dst;
    const uint8_t* from = src.data() + skew_src;
    if (round % 2 == 0) {
      StreamingCopy(to, from, bytes);
    } else {
      ASSERT_EQ(CopyAndChecksum(to, from, bytes),
                snapshot::Checksum(absl::MakeConstSpan(from, bytes)))
          << "seed " << seed << ", " << bytes << " bytes";
    }
    ASSERT_EQ(0, std::memcmp(to, from, bytes))
        << "seed " << seed << ", " << bytes << " bytes, skews " << skew_src
        << "/" << skew_dst;
    for (uint8_t* g = dst.data(); g < to; ++g) ASSERT_EQ(*g, 0x5A);
    for (uint8_t* g = to + bytes; g < dst.data() + dst.size(); ++g) {
      ASSERT_EQ(*g, 0x5A) << "seed " << seed << ": written past the end";
    }
  }
}

}  // namespace
}  // namespace ckpt::client
