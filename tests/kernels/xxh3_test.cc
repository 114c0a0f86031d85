// kernels/xxh3.h, the XXH3 the GPU runs, against libxxhash's XXH3_64bits:
// every length up to 4 KiB (all of XXH3's code paths and every way a last
// 1 KiB block and a last stripe can fall) at unaligned offsets, then large
// random lengths; the serial algorithm and the warp's decomposition alike.
#include "kernels/xxh3.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "snapshot/xxh3.h"
#include "tests/test_util.h"

namespace ckpt::kernels {
namespace {

constexpr uint8_t kSecret[xxh3::kSecretSize] = CKPT_XXH3_SECRET;

uint64_t AsWarp(const uint8_t* in, size_t len) {
  return len <= xxh3::kMidSizeMax ? xxh3::HashShort(in, len, kSecret)
                                  : xxh3::HashLongAsWarp(in, len, kSecret);
}

TEST(Xxh3Test, EveryLengthUpTo4KiBMatchesLibxxhash) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const std::vector<uint8_t> bytes = testing::RandomBytes(rng, 4096 + 8);
  for (size_t len = 0; len <= 4096; ++len) {
    for (size_t offset : {0, 1, 7}) {
      const uint8_t* in = bytes.data() + offset;
      const uint64_t expected = XXH3_64bits(in, len);
      ASSERT_EQ(xxh3::Hash(in, len), expected)
          << "length " << len << " offset " << offset;
      ASSERT_EQ(AsWarp(in, len), expected)
          << "length " << len << " offset " << offset << " (as a warp)";
    }
  }
}

TEST(Xxh3Test, LargeRandomLengthsMatchLibxxhash) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const std::vector<uint8_t> bytes = testing::RandomBytes(rng, (5 << 20) + 64);
  for (int i = 0; i < 40; ++i) {
    const size_t len = rng() % (5 << 20);
    const size_t offset = rng() % 64;
    const uint8_t* in = bytes.data() + offset;
    const uint64_t expected = XXH3_64bits(in, len);
    EXPECT_EQ(xxh3::Hash(in, len), expected) << "length " << len;
    EXPECT_EQ(AsWarp(in, len), expected) << "length " << len << " (as a warp)";
  }
  // Whole 1 KiB blocks exactly, and one byte either side.
  for (size_t len : {4u << 20, (4u << 20) + 1, (4u << 20) - 1}) {
    EXPECT_EQ(AsWarp(bytes.data(), len), XXH3_64bits(bytes.data(), len))
        << "length " << len;
  }
}

}  // namespace
}  // namespace ckpt::kernels
