#include "kernels/device.h"

#include "gtest/gtest.h"
#include "tests/kernels/device_test_util.h"

namespace ckpt::kernels {
namespace {

TEST(DeviceTest, CpuShuffleMatchesReference) {
  auto cpu = NewCpuDevice();
  ExpectShuffleMatchesReference(cpu.get(), testing::TestSeed());
}

TEST(DeviceTest, CpuChunkHashesMatchReference) {
  auto cpu = NewCpuDevice();
  ExpectHashChunksMatchReference(cpu.get(), testing::TestSeed());
}

}  // namespace
}  // namespace ckpt::kernels
