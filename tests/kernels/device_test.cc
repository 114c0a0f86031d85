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

TEST(DeviceTest, CpuBatchesMatchReference) {
  auto cpu = NewCpuDevice();
  ExpectBatchesMatchReference(cpu.get(), testing::TestSeed());
}

TEST(DeviceTest, OverlappingGatherPiecesAreRefused) {
  auto cpu = NewCpuDevice();
  uint8_t a[100], b[100];
  absl::StatusOr<std::unique_ptr<Batch>> gather =
      cpu->PrepareGather({{a, 100, 0}, {b, 100, 99}});
  ASSERT_FALSE(gather.ok());
  EXPECT_NE(gather.status().message().find("offsets 0 and 99 overlap"),
            std::string::npos)
      << gather.status();
  EXPECT_FALSE(cpu->PrepareHashes({{a, 100}}, 0).ok()) << "chunk size 0";
}

// The CUDA device's CPU twin queues its work: results are there after
// Synchronize, the same as the reference's.
TEST(DeviceTest, QueuedCpuDeviceMatchesReference) {
  auto queued = NewQueuedCpuDevice();
  EXPECT_TRUE(queued->queues_copies());
  ExpectShuffleMatchesReference(queued.get(), testing::TestSeed());
  ExpectHashChunksMatchReference(queued.get(), testing::TestSeed());
  ExpectBatchesMatchReference(queued.get(), testing::TestSeed());
}

}  // namespace
}  // namespace ckpt::kernels
