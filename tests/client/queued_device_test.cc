// libckpt's GPU save and restore paths on the CUDA device's CPU twin
// (DeviceKind::kCpuQueued: copies queued and completed later, chunk hashes
// taken "on the device" with the GPU kernel's arithmetic), against a real
// ckptd: what runs on a GPU, checked where there is none.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "client/checkpointer.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/dtype.h"
#include "tests/client/daemon_process.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

TEST(QueuedDeviceTest, TensorsAreSavedWithTheDevicesChunkHashesAndRestored) {
  testing::DaemonProcess daemon({"--keep-memory", "1"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  // Three 4 MiB chunks, the last one short; a tensor of one short chunk.
  const size_t big = (9 << 20) + 12, small = 100;
  std::vector<uint8_t> w(big), b(small);
  std::string rng;
  auto fill = [&](uint64_t step) {
    for (size_t i = 0; i < big; ++i) w[i] = static_cast<uint8_t>(i * 31 + step);
    for (size_t i = 0; i < small; ++i) b[i] = static_cast<uint8_t>(i ^ step);
    rng = "rng-" + std::to_string(step);
  };
  CheckpointerOptions options{"queued", 0, 1, daemon.socket()};
  options.device = DeviceKind::kCpuQueued;
  auto ckpt = Checkpointer::Connect(options);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_TRUE((*ckpt)
                  ->RegisterTensor("w", proto::DTYPE_UINT8, w.data(),
                                   {static_cast<int64_t>(big)}, {0},
                                   {static_cast<int64_t>(big)})
                  .ok());
  ASSERT_TRUE((*ckpt)
                  ->RegisterTensor("b", proto::DTYPE_UINT8, b.data(),
                                   {static_cast<int64_t>(small)}, {0},
                                   {static_cast<int64_t>(small)})
                  .ok());
  ASSERT_TRUE((*ckpt)->RegisterBytes("rng", &rng).ok());
  for (uint64_t step = 1; step <= 2; ++step) {
    fill(step);
    auto save = (*ckpt)->SaveAsync(step);
    ASSERT_TRUE(save.ok()) << save.status();
    // No compute stream on the CPU twin: the hook only has to succeed.
    ASSERT_TRUE((*save)->OrderStream(nullptr).ok());
    ASSERT_TRUE((*save)->WaitStaged().ok());
    absl::Status committed = (*save)->WaitCommitted(proto::TIER_LOCAL_DISK);
    ASSERT_TRUE(committed.ok()) << committed << "\n" << daemon.log();
  }
  // The tensors' 3 + 1 chunks of each save were hashed by the device; the
  // byte item's by the host.
  EXPECT_EQ((*ckpt)->stats().chunks_hashed_on_device, 8u);

  // From the memory tier (checked against those hashes), then from the
  // shard file of step 1 (its chunks carry them as their checksums).
  for (uint64_t step : {2, 1}) {
    std::fill(w.begin(), w.end(), 0);
    std::fill(b.begin(), b.end(), 0);
    rng.clear();
    absl::Status restored = (*ckpt)->Restore(step);
    ASSERT_TRUE(restored.ok()) << "step " << step << ": " << restored << "\n"
                               << daemon.log();
    std::vector<uint8_t> w_expected(big), b_expected(small);
    for (size_t i = 0; i < big; ++i)
      w_expected[i] = static_cast<uint8_t>(i * 31 + step);
    for (size_t i = 0; i < small; ++i)
      b_expected[i] = static_cast<uint8_t>(i ^ step);
    EXPECT_EQ(w, w_expected) << "step " << step;
    EXPECT_EQ(b, b_expected) << "step " << step;
    EXPECT_EQ(rng, "rng-" + std::to_string(step));
  }
}

// A restore of device tensors from the memory tier copies each chunk into a
// pinned buffer, checks it there, and only then sends it to the device: a
// flipped bit in the slot is caught and the verified shard file is read
// instead.
TEST(QueuedDeviceTest, ACorruptSlotIsCaughtBeforeItReachesTheDevice) {
  testing::DaemonProcess daemon({"--keep-memory", "2"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<uint8_t> w = testing::RandomBytes(rng, (9 << 20) + 3);
  const std::vector<uint8_t> saved = w;
  CheckpointerOptions options{"queuedbad", 0, 1, daemon.socket()};
  options.device = DeviceKind::kCpuQueued;
  options.restore_buffer_bytes = 8 << 20;  // two 4 MiB chunks per half
  auto ckpt = Checkpointer::Connect(options);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const int64_t n = static_cast<int64_t>(w.size());
  ASSERT_TRUE(
      (*ckpt)
          ->RegisterTensor("w", proto::DTYPE_UINT8, w.data(), {n}, {0}, {n})
          .ok());
  auto save = (*ckpt)->SaveAsync(4);
  ASSERT_TRUE(save.ok()) << save.status();
  ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
  auto shard = (*ckpt)->DescribeShard(4);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_FALSE(shard->slot_path().empty()) << "still in the memory tier";

  std::fill(w.begin(), w.end(), 0);
  ASSERT_TRUE((*ckpt)->Restore(4).ok());
  EXPECT_TRUE(w == saved) << "from the memory tier";
  {
    auto slot = io::DefaultFileSystem()->MapFile(shard->slot_path(), {});
    ASSERT_TRUE(slot.ok()) << slot.status();
    (*slot)->data()[shard->items(0).slot_offset() + (5 << 20)] ^= 0x10;
  }
  std::fill(w.begin(), w.end(), 0);
  absl::Status restored = (*ckpt)->Restore(4);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << daemon.log();
  EXPECT_TRUE(w == saved) << "from the shard file, not the bad slot";
}

// 2000 small tensors of every dtype (64 B to 64 KiB, log-uniform) and one
// larger one: the small ones are gathered by a few launches through a 1 MiB
// device buffer, and everything comes back bit-exact from the memory tier and
// from the shard file.
TEST(QueuedDeviceTest, ThousandsOfSmallTensorsOfEveryDtypeAreGathered) {
  testing::DaemonProcess daemon({"--keep-memory", "1"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  constexpr int kSmall = 2000;
  std::vector<std::vector<uint8_t>> tensors;
  std::vector<proto::DType> dtypes;
  uint64_t small_bytes = 0;
  for (int i = 0; i <= kSmall; ++i) {
    const auto dtype = static_cast<proto::DType>(1 + i % 15);
    const size_t width = snapshot::DTypeSize(dtype);
    const size_t bytes =
        i < kSmall ? static_cast<size_t>(std::exp2(
                         6 + std::uniform_real_distribution<>(0, 10)(rng)))
                   : size_t{3} << 20;
    tensors.emplace_back(std::max<size_t>(bytes / width, 1) * width);
    dtypes.push_back(dtype);
    if (i < kSmall) small_bytes += tensors.back().size();
  }
  auto fill = [&](uint64_t step) {
    std::mt19937_64 values(seed + step);
    for (auto& t : tensors) {  // in place: the registered memory stays
      const std::vector<uint8_t> v = testing::RandomBytes(values, t.size());
      std::copy(v.begin(), v.end(), t.begin());
    }
  };
  CheckpointerOptions options{"gathered", 0, 1, daemon.socket()};
  options.device = DeviceKind::kCpuQueued;
  options.gather_buffer_bytes = 1 << 20;
  // The restore from the file: many halves of 512 KiB, and the 3 MiB tensor
  // in ranges.
  options.restore_buffer_bytes = 1 << 20;
  auto ckpt = Checkpointer::Connect(options);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t elements = static_cast<int64_t>(
        tensors[i].size() / snapshot::DTypeSize(dtypes[i]));
    ASSERT_TRUE((*ckpt)
                    ->RegisterTensor("t" + std::to_string(i), dtypes[i],
                                     tensors[i].data(), {elements}, {0},
                                     {elements})
                    .ok());
  }
  std::string rng_state;
  ASSERT_TRUE((*ckpt)->RegisterBytes("rng", &rng_state).ok());
  for (uint64_t step = 1; step <= 2; ++step) {
    fill(step);
    rng_state = "rng-" + std::to_string(step);
    auto save = (*ckpt)->SaveAsync(step);
    ASSERT_TRUE(save.ok()) << save.status();
    absl::Status committed = (*save)->WaitCommitted(proto::TIER_LOCAL_DISK);
    ASSERT_TRUE(committed.ok()) << committed << "\n" << daemon.log();
  }
  const CheckpointerStats stats = (*ckpt)->stats();
  EXPECT_EQ(stats.tensors_gathered, 2u * kSmall);
  EXPECT_GE(stats.gather_launches, 2 * ((small_bytes + (1 << 20) - 1) >> 20));
  EXPECT_LE(stats.gather_launches, 2 * (2 * (small_bytes >> 20) + 2));
  EXPECT_EQ(stats.gather_refused, "");
  EXPECT_EQ(stats.chunks_hashed_on_device, 2u * (kSmall + 1))
      << "one 4 MiB chunk each";

  for (uint64_t step : {2, 1}) {  // memory tier, then the shard file
    for (auto& t : tensors) std::fill(t.begin(), t.end(), 0);
    rng_state.clear();
    absl::Status restored = (*ckpt)->Restore(step);
    ASSERT_TRUE(restored.ok()) << "step " << step << ": " << restored;
    std::mt19937_64 values(seed + step);
    for (size_t i = 0; i < tensors.size(); ++i) {
      ASSERT_EQ(tensors[i], testing::RandomBytes(values, tensors[i].size()))
          << "step " << step << ", tensor " << i << " (dtype " << dtypes[i]
          << ", " << tensors[i].size() << " bytes)";
    }
    EXPECT_EQ(rng_state, "rng-" + std::to_string(step));
  }
}

}  // namespace
}  // namespace ckpt::client
