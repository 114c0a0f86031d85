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

// The CUDA device's CPU twin queues its work: results are there after
// Synchronize, the same as the reference's.
TEST(DeviceTest, QueuedCpuDeviceMatchesReference) {
  auto queued = NewQueuedCpuDevice();
  EXPECT_TRUE(queued->queues_copies());
  ExpectShuffleMatchesReference(queued.get(), testing::TestSeed());
  ExpectHashChunksMatchReference(queued.get(), testing::TestSeed());
}

}  // namespace
}  // namespace ckpt::kernels
