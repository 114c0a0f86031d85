// DeviceStager on the CUDA device's CPU twin: a save's many small tensors are
// gathered by a few launches through a bounded buffer, large ones copied one
// by one, every byte lands where the layout says, and a device without memory
// for the buffer still saves everything, copying each tensor.
#include "client/device_stager.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "snapshot/chunk_codec.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

// `count` tensors of 4 KiB to 1 MiB (log-uniform) and `large` of 2 MiB,
// laid out the way the Checkpointer does: gathered ones first, together.
struct Model {
  Model(std::mt19937_64& rng, size_t count, size_t large,
        const DeviceStager& stager) {
    for (size_t i = 0; i < count + large; ++i) {
      const size_t n =
          i < count ? static_cast<size_t>(std::exp2(
                          12 + std::uniform_real_distribution<>(0, 8)(rng)))
                    : size_t{2} << 20;
      data.push_back(testing::RandomBytes(rng, n));
    }
    uint64_t offset = 0;
    for (int pass = 0; pass < 2; ++pass) {
      for (const std::vector<uint8_t>& d : data) {
        if (stager.Gathers(d.size()) != (pass == 0)) continue;
        offset = (offset + 63) / 64 * 64;
        tensors.push_back({d.data(), d.size(), offset});
        offset += d.size();
      }
    }
    slot_bytes = offset;
  }
  void ExpectStaged(const std::vector<uint8_t>& slot) const {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto* src = static_cast<const uint8_t*>(tensors[i].data);
      ASSERT_TRUE(std::equal(src, src + tensors[i].bytes,
                             slot.begin() + tensors[i].slot_offset))
          << "tensor " << i << " of " << tensors[i].bytes << " bytes at "
          << tensors[i].slot_offset;
    }
  }
  std::vector<std::vector<uint8_t>> data;
  std::vector<DeviceStager::Tensor> tensors;
  uint64_t slot_bytes = 0;
};

TEST(DeviceStagerTest, SmallTensorsAreGatheredInBatchesOfTheBuffersSize) {
  std::mt19937_64 rng(testing::TestSeed());
  auto device = kernels::NewQueuedCpuDevice();
  DeviceStager stager(device.get(), {1 << 20, 16 << 20});
  Model model(rng, 2000, 3, stager);
  uint64_t small_bytes = 0;
  for (const auto& t : model.tensors) {
    if (stager.Gathers(t.bytes)) small_bytes += t.bytes;
  }
  for (int save = 1; save <= 2; ++save) {  // the second reuses the batches
    std::vector<uint8_t> slot(model.slot_bytes, 0xee);
    ASSERT_TRUE(stager.QueueCopies(model.tensors, slot.data()).ok());
    ASSERT_TRUE(device->Synchronize().ok());
    model.ExpectStaged(slot);
    const DeviceStager::Stats& stats = stager.stats();
    EXPECT_EQ(stats.tensors_gathered, 2000u * save);
    EXPECT_EQ(stats.tensors_copied, 3u * save) << "the 2 MiB tensors";
    // Batches of at most 16 MiB of slot each, and not many more.
    const uint64_t at_least = (small_bytes + (16 << 20) - 1) / (16 << 20);
    EXPECT_GE(stats.gather_launches, at_least * save);
    EXPECT_LE(stats.gather_launches, (2 * at_least + 1) * save);
    EXPECT_EQ(stats.gather_refused, "");
  }
}

TEST(DeviceStagerTest, WithoutDeviceMemoryForTheBufferEachTensorIsCopied) {
  std::mt19937_64 rng(testing::TestSeed());
  // The device refuses any allocation above 1 MiB, as a full GPU would.
  auto device = kernels::NewQueuedCpuDevice(1 << 20);
  DeviceStager stager(device.get(), {1 << 20, 16 << 20});
  Model model(rng, 300, 1, stager);
  std::vector<uint8_t> slot(model.slot_bytes, 0xee);
  ASSERT_TRUE(stager.QueueCopies(model.tensors, slot.data()).ok());
  ASSERT_TRUE(device->Synchronize().ok());
  model.ExpectStaged(slot);
  EXPECT_EQ(stager.stats().tensors_gathered, 0u);
  EXPECT_EQ(stager.stats().tensors_copied, 301u);
  EXPECT_NE(stager.stats().gather_refused.find("no device buffer of"),
            std::string::npos)
      << stager.stats().gather_refused;
  EXPECT_NE(stager.stats().gather_refused.find("out of device memory"),
            std::string::npos)
      << stager.stats().gather_refused;
}

TEST(DeviceStagerTest, GatheredTensorsFarApartAreNotCopiedOverWhatLiesBetween) {
  auto device = kernels::NewQueuedCpuDevice();
  DeviceStager stager(device.get(), {1 << 20, 16 << 20});
  std::vector<uint8_t> a(1000, 1), b(2000, 2);
  // A byte item of the caller lies between them in the slot.
  std::vector<DeviceStager::Tensor> tensors = {{a.data(), a.size(), 0},
                                               {b.data(), b.size(), 20000}};
  std::vector<uint8_t> slot(22000, 0xee);
  ASSERT_TRUE(stager.QueueCopies(tensors, slot.data()).ok());
  ASSERT_TRUE(device->Synchronize().ok());
  EXPECT_EQ(slot[0], 1);
  EXPECT_EQ(slot[20000], 2);
  EXPECT_EQ(slot[10000], 0xee) << "the gap was written";
  EXPECT_EQ(stager.stats().gather_launches, 2u);
}

TEST(DeviceStagerTest, ChunkHashesOfEveryTensorComeFromOneBatch) {
  std::mt19937_64 rng(testing::TestSeed());
  auto device = kernels::NewQueuedCpuDevice();
  DeviceStager stager(device.get(), {});
  Model model(rng, 200, 2, stager);
  for (uint32_t chunk : {4096u, 1u << 20}) {
    std::vector<uint64_t> first;
    ASSERT_TRUE(stager.QueueHashes(model.tensors, chunk, &first).ok());
    ASSERT_TRUE(device->Synchronize().ok());
    ASSERT_EQ(first.size(), model.tensors.size());
    for (size_t i = 0; i < model.tensors.size(); ++i) {
      const auto* p = static_cast<const uint8_t*>(model.tensors[i].data);
      const uint64_t n = model.tensors[i].bytes;
      for (uint64_t at = 0, c = 0; at < n; at += chunk, ++c) {
        ASSERT_EQ(
            stager.hashes()[first[i] + c],
            snapshot::Checksum({p + at, std::min<uint64_t>(chunk, n - at)}))
            << "tensor " << i << " chunk " << c << " of " << chunk << " bytes";
      }
    }
  }
}

}  // namespace
}  // namespace ckpt::client
