#include "kernels/device.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/shuffle.h"
#include "snapshot/filter.h"
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

// The GPU shuffle kernel's per-thread work (kernels/shuffle.h), run on the
// host as grids of several sizes would: every width it takes, sizes with and
// without whole groups of four elements and a tail, destinations where words
// can and cannot be stored.
TEST(DeviceTest, GpuShuffleArithmeticMatchesReference) {
  std::mt19937_64 rng(testing::TestSeed());
  for (size_t n :
       {0ul, 1ul, 15ul, 16ul, 64ul, 100ul, 4096ul, 4099ul, 65541ul}) {
    const std::vector<uint8_t> src = testing::RandomBytes(rng, n);
    for (size_t width : {2u, 4u, 8u}) {
      std::vector<uint8_t> expected(n);
      snapshot::ByteShuffle(src.data(), expected.data(), n, width);
      for (size_t shift : {0u, 1u, 2u}) {
        for (size_t threads : {1u, 7u, 256u}) {
          std::vector<uint8_t> out(n + shift, 0xee);
          uint8_t* dst = out.data() + shift;
          switch (width) {
            case 2:
              shuffle::ShuffleAsGrid<2>(src.data(), dst, n, threads);
              break;
            case 4:
              shuffle::ShuffleAsGrid<4>(src.data(), dst, n, threads);
              break;
            default:
              shuffle::ShuffleAsGrid<8>(src.data(), dst, n, threads);
          }
          EXPECT_TRUE(std::equal(expected.begin(), expected.end(), dst))
              << "width " << width << " n " << n << " shift " << shift
              << " threads " << threads;
        }
      }
    }
  }
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
