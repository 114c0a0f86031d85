// Compares a device's byte-shuffle with the CPU reference on random inputs of
// awkward sizes.
#ifndef CKPT_TESTS_KERNELS_DEVICE_TEST_UTIL_H_
#define CKPT_TESTS_KERNELS_DEVICE_TEST_UTIL_H_

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
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

}  // namespace ckpt::kernels

#endif  // CKPT_TESTS_KERNELS_DEVICE_TEST_UTIL_H_
