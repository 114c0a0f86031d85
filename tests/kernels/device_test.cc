#include "kernels/device.h"

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gather.h"
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

// The GPU gather kernel's per-thread work (kernels/gather.h), run on the
// host as grids of several shapes would, lands every piece as the CPU's
// gather does: pieces within one entry and across several, sources and
// destinations on and off 16-byte alignment.
TEST(DeviceTest, GpuGatherArithmeticMatchesReference) {
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<std::vector<uint8_t>> pieces_data;
  std::vector<GatherPiece> pieces;
  uint64_t offset = 0;
  for (int i = 0; i < 120; ++i) {
    const size_t n = i % 11 == 0 ? 0 : (size_t{1} << (rng() % 18)) + rng() % 33;
    pieces_data.push_back(testing::RandomBytes(rng, n + 16));
    const size_t shift = i % 3 == 0 ? 0 : rng() % 16;
    pieces.push_back({pieces_data.back().data() + shift, n, offset});
    offset += n + (i % 2 == 0 ? (16 - n % 16) % 16 : rng() % 7);
  }
  auto batch = NewHostGather(pieces);
  ASSERT_TRUE(batch.ok()) << batch.status();
  std::vector<uint8_t> expected((*batch)->outputs() + 16, 0xee);
  RunGatherOnHost(**batch, expected.data());
  for (auto [blocks, threads] :
       {std::pair<size_t, size_t>{1, 1}, {3, 7}, {4096, 256}}) {
    std::vector<uint8_t> actual(expected.size(), 0xee);
    gather::GatherAsGrid(**batch, actual.data(), blocks, threads);
    EXPECT_TRUE(actual == expected)
        << blocks << " blocks of " << threads << " threads";
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
