#include "daemon/health/liveness.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

TEST(LivenessTest, NamesAHousekeepingLoopThatStoppedComingRound) {
  const absl::Time t0 = absl::Now();
  Liveness live(absl::Milliseconds(500));
  live.HousekeepingRound(t0);
  EXPECT_TRUE(live.Check(absl::Seconds(1), t0 + absl::Seconds(2)).ok())
      << "four ticks of grace past the stall";
  absl::Status stuck = live.Check(absl::Seconds(1), t0 + absl::Seconds(4));
  EXPECT_EQ(stuck.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(stuck.message(),
              HasSubstr("the housekeeping loop has not come round for 4s"));
}

TEST(LivenessTest, NamesThePersistThatStoppedWriting) {
  const absl::Time t0 = absl::Now();
  Liveness live(absl::Milliseconds(500));
  live.HousekeepingRound(t0 + absl::Seconds(10));
  live.PersistProgressed({"j", 3, 1}, t0);
  live.PersistProgressed({"j", 4, 1}, t0 + absl::Seconds(9));
  absl::Status hung = live.Check(absl::Seconds(5), t0 + absl::Seconds(10));
  EXPECT_EQ(hung.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(hung.message(),
              HasSubstr("job j step 3 rank 1: its persist has not written a "
                        "chunk for 10s"));
  live.PersistEnded({"j", 3, 1});
  EXPECT_TRUE(live.Check(absl::Seconds(5), t0 + absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace ckpt::daemon
