// libckpt's GPU save and restore paths on the CUDA device's CPU twin
// (DeviceKind::kCpuQueued: copies queued and completed later, chunk hashes
// taken "on the device" with the GPU kernel's arithmetic), against a real
// ckptd: what runs on a GPU, checked where there is none.
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "client/checkpointer.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"

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

}  // namespace
}  // namespace ckpt::client
