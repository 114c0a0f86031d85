// UploadFromShard on the CUDA device's CPU twin: a shard file's tensors reach
// "device memory" through the pinned double buffer whatever its size (many
// small tensors per half, large ones in ranges), and a bad chunk fails the
// restore with DataLoss.
#include "client/device_upload.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

TEST(DeviceUploadTest, EveryTensorArrivesWhateverTheBuffersSize) {
  testing::TempDir dir;
  const std::string path = dir.File("s.shard");
  std::mt19937_64 rng(testing::TestSeed());
  snapshot::ShardWriterOptions options;
  options.chunk_size = 64 << 10;
  snapshot::ShardWriter writer(io::DefaultFileSystem(), path, {"j", 1, 0, 1},
                               options);
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < 300; ++i) {
    const size_t n = i == 7 ? (3 << 20) + 5 : i % 50 == 0 ? 0 : rng() % 200000;
    data.push_back(testing::RandomBytes(rng, n));
    ASSERT_TRUE(writer.AddBytes("t" + std::to_string(i), data.back()).ok());
  }
  ASSERT_TRUE(writer.Commit().ok());
  auto reader = snapshot::ShardReader::Open(io::DefaultFileSystem(), path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto device = kernels::NewQueuedCpuDevice();
  for (uint64_t buffer :
       {uint64_t{8192}, uint64_t{1} << 20, uint64_t{1} << 30}) {
    std::vector<std::vector<uint8_t>> memory;
    std::vector<UploadTensor> tensors;
    for (size_t i = 0; i < data.size(); ++i) {
      memory.emplace_back(data[i].size(), 0xee);
    }
    for (size_t i = 0; i < data.size(); ++i) {
      tensors.push_back(
          {"t" + std::to_string(i), memory[i].data(), memory[i].size()});
    }
    absl::Status s = UploadFromShard(device.get(), **reader, tensors, buffer);
    ASSERT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < data.size(); ++i) {
      ASSERT_EQ(memory[i], data[i])
          << "tensor " << i << ", a buffer of " << buffer << " bytes";
    }
  }
}

TEST(DeviceUploadTest, ABadChunkFailsTheRestore) {
  testing::TempDir dir;
  const std::string path = dir.File("b.shard");
  std::mt19937_64 rng(testing::TestSeed());
  snapshot::ShardWriterOptions options;
  options.chunk_size = 4096;
  snapshot::ShardWriter writer(io::DefaultFileSystem(), path, {"j", 1, 0, 1},
                               options);
  const std::vector<uint8_t> data = testing::RandomBytes(rng, 3 * 4096);
  // The hashes the "trainer" took, one of them wrong: the reader's check of
  // the chunk fails.
  std::vector<uint64_t> hashes;
  for (int c = 0; c < 3; ++c) {
    hashes.push_back(snapshot::Checksum({data.data() + c * 4096, 4096}));
  }
  hashes[1] ^= 1;
  ASSERT_TRUE(writer.AddBytes("w", data, hashes).ok());
  ASSERT_TRUE(writer.Commit().ok());
  auto reader = snapshot::ShardReader::Open(io::DefaultFileSystem(), path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto device = kernels::NewQueuedCpuDevice();
  std::vector<uint8_t> memory(data.size());
  absl::Status s = UploadFromShard(device.get(), **reader,
                                   {{"w", memory.data(), memory.size()}}, 8192);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST(DeviceUploadTest, HostRunsArriveCheckedWhereTheyLanded) {
  std::mt19937_64 rng(testing::TestSeed());
  auto device = kernels::NewQueuedCpuDevice();
  std::vector<std::vector<uint8_t>> src, dst;
  for (int i = 0; i < 100; ++i) {
    src.push_back(testing::RandomBytes(rng, i % 10 == 0 ? 0 : rng() % 300000));
    dst.emplace_back(src.back().size(), 0xee);
  }
  std::vector<HostRun> runs;
  for (size_t i = 0; i < src.size(); ++i) {
    runs.push_back({src[i].data(), dst[i].data(), src[i].size()});
  }
  for (uint64_t buffer :
       {uint64_t{4096}, uint64_t{1} << 20, uint64_t{1} << 30}) {
    std::vector<int> checked(runs.size(), 0);
    absl::Status s = UploadFromHost(
        device.get(), runs,
        [&](size_t i, absl::Span<const uint8_t> landed) {
          ++checked[i];
          EXPECT_TRUE(std::equal(landed.begin(), landed.end(), src[i].begin(),
                                 src[i].end()));
          return absl::OkStatus();
        },
        buffer);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(dst, src) << "a buffer of " << buffer << " bytes";
    for (size_t i = 0; i < runs.size(); ++i) {
      EXPECT_EQ(checked[i], src[i].empty() ? 0 : 1) << "run " << i;
    }
  }
  // A run that fails its check stops the upload with its error.
  absl::Status s = UploadFromHost(
      device.get(), runs,
      [](size_t i, absl::Span<const uint8_t>) {
        return i == 57 ? absl::DataLossError("run 57 is bad")
                       : absl::OkStatus();
      },
      1 << 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "run 57 is bad");
}

}  // namespace
}  // namespace ckpt::client
