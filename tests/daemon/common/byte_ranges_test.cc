// ByteRanges (daemon/common/byte_ranges.h) against a bitmap of the same
// bytes: random adds and removes, every answer checked (seed printed).
#include "daemon/common/byte_ranges.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

TEST(ByteRangesTest, AgreesWithABitmapUnderRandomAddsAndRemoves) {
  constexpr uint64_t kSize = 300;
  std::mt19937_64 rng(testing::TestSeed());
  for (int round = 0; round < 50; ++round) {
    ByteRanges set;
    std::vector<bool> bits(kSize, false);
    for (int op = 0; op < 40; ++op) {
      uint64_t a = rng() % kSize, b = rng() % (kSize + 1);
      if (a > b) std::swap(a, b);
      const bool add = rng() % 3 != 0;
      if (add) {
        set.Add(a, b);
      } else {
        set.Remove(a, b);
      }
      for (uint64_t i = a; i < b; ++i) bits[i] = add;
      // What Missing says of a random window is exactly the unset bits.
      uint64_t c = rng() % kSize, d = rng() % (kSize + 1);
      if (c > d) std::swap(c, d);
      std::vector<bool> missing(kSize, false);
      uint64_t last_end = 0;
      for (const ByteRanges::Range& r : set.Missing(c, d)) {
        ASSERT_LT(r.first, r.second);
        ASSERT_GE(r.first, c);
        ASSERT_LE(r.second, d);
        ASSERT_GE(r.first, last_end) << "ranges in order, apart";
        last_end = r.second;
        for (uint64_t i = r.first; i < r.second; ++i) missing[i] = true;
      }
      uint64_t set_bytes = 0;
      for (uint64_t i = 0; i < kSize; ++i) {
        set_bytes += bits[i];
        if (i >= c && i < d) ASSERT_EQ(missing[i], !bits[i]) << "byte " << i;
      }
      EXPECT_EQ(set.bytes(), set_bytes);
      EXPECT_EQ(set.Covers(c, d), set.Missing(c, d).empty());
    }
  }
}

TEST(ByteRangesTest, TouchingRangesMergeAndAnEmptyRangeIsCovered) {
  ByteRanges set;
  set.Add(0, 10);
  set.Add(10, 20);
  set.Add(30, 40);
  EXPECT_TRUE(set.Covers(0, 20));
  EXPECT_FALSE(set.Covers(0, 31));
  EXPECT_TRUE(set.Covers(25, 25));
  EXPECT_EQ(set.Missing(5, 35), (std::vector<ByteRanges::Range>{{20, 30}}));
  set.Remove(5, 35);
  EXPECT_EQ(set.bytes(), 10u);
  EXPECT_EQ(set.Missing(0, 40), (std::vector<ByteRanges::Range>{{5, 35}}));
}

}  // namespace
}  // namespace ckpt::daemon
