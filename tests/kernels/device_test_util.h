// Compares a device's byte-shuffle and chunk hashes with the CPU reference on
// random inputs of awkward sizes.
#ifndef CKPT_TESTS_KERNELS_DEVICE_TEST_UTIL_H_
#define CKPT_TESTS_KERNELS_DEVICE_TEST_UTIL_H_

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/filter.h"
#include "tests/test_util.h"

namespace ckpt::kernels {

inline void ExpectShuffleMatchesReference(Device* device, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t width : {1u, 2u, 4u, 8u}) {
    for (size_t n : {0ul, 1ul, 7ul, 4096ul, 1000003ul}) {
      std::vector<uint8_t> src = testing::RandomBytes(rng, n), expected(n),
                           actual(n);
      snapshot::ByteShuffle(src.data(), expected.data(), n, width);
      auto in = device->Allocate(n);
      auto out = device->Allocate(n);
      ASSERT_TRUE(in.ok() && out.ok());
      ASSERT_TRUE(device->CopyFromHost(src.data(), *in, n).ok());
      ASSERT_TRUE(device->ByteShuffle(*in, *out, n, width).ok());
      ASSERT_TRUE(device->CopyToHost(*out, actual.data(), n).ok());
      ASSERT_TRUE(device->Synchronize().ok());
      EXPECT_EQ(actual, expected)
          << device->name() << " width " << width << " n " << n;
      device->Free(*in);
      device->Free(*out);
    }
  }
}

// Chunk hashes of pieces of every length class XXH3 has (short, mid-size,
// whole 1 KiB blocks and not), at offsets that are not multiples of 8.
inline void ExpectHashChunksMatchReference(Device* device, uint64_t seed) {
  std::mt19937_64 rng(seed);
  struct Case {
    size_t n, chunk, offset;
  };
  std::vector<Case> cases = {{0, 64, 0},
                             {1, 64, 0},
                             {240, 240, 0},
                             {241, 1024, 3},
                             {1025, 1024, 1},
                             {4096, 1000, 7},
                             {3 << 20, 1 << 20, 0},
                             {(5 << 20) + 13, 4 << 20, 5}};
  for (int i = 0; i < 20; ++i) {
    const size_t chunk = 1 + rng() % 70000;
    cases.push_back({rng() % (4 * chunk), chunk, rng() % 16});
  }
  for (const Case& c : cases) {
    const std::vector<uint8_t> src = testing::RandomBytes(rng, c.n + c.offset);
    const size_t count = (c.n + c.chunk - 1) / c.chunk;
    std::vector<uint64_t> expected(count), actual(count, 0);
    for (size_t i = 0; i < count; ++i) {
      const size_t at = i * c.chunk;
      expected[i] = snapshot::Checksum(
          {src.data() + c.offset + at, std::min(c.chunk, c.n - at)});
    }
    auto in = device->Allocate(src.size());
    ASSERT_TRUE(in.ok()) << in.status();
    ASSERT_TRUE(device->CopyFromHost(src.data(), *in, src.size()).ok());
    absl::Status hashed =
        device->HashChunks(static_cast<const uint8_t*>(*in) + c.offset, c.n,
                           c.chunk, actual.data());
    ASSERT_TRUE(hashed.ok()) << hashed;
    ASSERT_TRUE(device->Synchronize().ok());
    EXPECT_EQ(actual, expected) << device->name() << " n " << c.n << " chunk "
                                << c.chunk << " offset " << c.offset;
    device->Free(*in);
  }
}

}  // namespace ckpt::kernels

#endif  // CKPT_TESTS_KERNELS_DEVICE_TEST_UTIL_H_
