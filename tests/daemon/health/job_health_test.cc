#include "daemon/health/job_health.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::Time At(int seconds) {
  return absl::FromUnixSeconds(1'000'000 + seconds);
}

TEST(JobHealthTest, StagingCostsCountAndEarlierUnfinishedStagingsAreAbandoned) {
  Metrics metrics;
  JobHealth health(&metrics);
  health.StagingBegun({"j", 1, 0}, At(0));
  health.StagingBegun({"j", 1, 1}, At(0));
  health.StagingBegun({"j", 2, 0}, At(10));
  health.StagingBegun({"j", 3, 0}, At(20));
  // Rank 0 staged step 3: its steps 1 and 2 never completed; rank 1's stays.
  EXPECT_EQ(health.Staged({"j", 3, 0}, At(22)), (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(health.Staged({"j", 1, 1}, At(4)).empty());
  const JobHealth::Figures f = health.Of("j");
  EXPECT_EQ(f.stagings, 2u);
  EXPECT_DOUBLE_EQ(f.staging_seconds, 2 + 4);
  EXPECT_THAT(metrics.Render(),
              HasSubstr("ckpt_save_cost_seconds{job=\"j\"} 3"));
}

TEST(JobHealthTest, ASaveOfAStepNotNewerIsAJobRestartAndItsRecovery) {
  Metrics metrics;
  JobHealth health(&metrics);
  health.SawSave("j", 10, At(0));
  health.SawSave("j", 20, At(100));
  health.SawSave("j", 30, At(200));
  EXPECT_EQ(health.Of("j").intervals, 2);
  EXPECT_DOUBLE_EQ(health.Of("j").interval, 100);
  EXPECT_EQ(health.Of("j").failures, 0);
  health.SawSave("j", 20, At(260));  // resumed from step 20
  const JobHealth::Figures f = health.Of("j");
  EXPECT_EQ(f.failures, 1);
  EXPECT_EQ(f.intervals, 2) << "a restart is no interval";
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("ckpt_failures_detected_total{job=\"j\",kind="
                              "\"job_restart\"} 1"));
  EXPECT_THAT(text, HasSubstr("ckpt_recovery_seconds_sum{job=\"j\",kind="
                              "\"job_restart\"} 60"));
  // A rollback to step 5 makes a save of step 6 an ordinary one.
  health.RolledBackTo("j", 5);
  health.SawSave("j", 6, At(300));
  EXPECT_EQ(health.Of("j").failures, 1);
}

TEST(JobHealthTest, ADaemonRestartEndsAtTheJobsFirstSaveAfterIt) {
  Metrics metrics;
  JobHealth health(&metrics);
  health.DaemonRestarted("j", At(0), At(30));
  EXPECT_EQ(health.Of("j").failures, 1);
  EXPECT_EQ(health.Of("j").down_since, At(0));
  health.SawSave("j", 7, At(45));
  EXPECT_EQ(health.Of("j").down_since, absl::InfinitePast());
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("ckpt_recovery_seconds_sum{job=\"j\",kind="
                              "\"daemon_restart\"} 45"));
  EXPECT_THAT(text, HasSubstr("ckpt_recoveries_total{job=\"j\",kind="
                              "\"daemon_restart\"} 1"));
}

TEST(JobHealthTest, CommitsNeverGoBackAndLatencyRunsFromTheFirstStaging) {
  Metrics metrics;
  JobHealth health(&metrics);
  health.StagingBegun({"j", 2, 1}, At(0));
  health.StagingBegun({"j", 2, 0}, At(5));
  health.Committed("j", 2, {proto::TIER_MEMORY, proto::TIER_LOCAL_DISK}, At(8));
  health.Committed("j", 1, {proto::TIER_LOCAL_DISK}, At(9));  // late, older
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("ckpt_last_committed_step{job=\"j\",tier="
                              "\"local_disk\"} 2"));
  EXPECT_THAT(text, Not(HasSubstr("ckpt_last_committed_step{job=\"j\",tier="
                                  "\"local_disk\"} 1")));
  EXPECT_THAT(text, HasSubstr("ckpt_commit_latency_seconds_sum{job=\"j\","
                              "tier=\"memory\"} 8"));
  EXPECT_THAT(text, HasSubstr("ckpt_last_commit_age_seconds{job=\"j\",tier="
                              "\"memory\"}"));
}

TEST(JobHealthTest, YoungDalyFollowsFromTheCostAndTheFailureRate) {
  Metrics metrics;
  JobHealth health(&metrics);
  // Cost 2 s a save; one failure over the time since the job was first seen.
  health.StagingBegun({"j", 1, 0}, At(0));
  health.Staged({"j", 1, 0}, At(2));
  health.SawSave("j", 1, absl::Now() - absl::Seconds(3600));
  health.SawSave("j", 1, absl::Now());
  const std::string text = metrics.Render();
  EXPECT_THAT(text, HasSubstr("ckpt_mtbf_seconds{job=\"j\"} 3600"));
  // sqrt(2 * 2 * 3600) = 120.
  EXPECT_THAT(text,
              HasSubstr("ckpt_young_daly_interval_seconds{job=\"j\"} 120"));
}

}  // namespace
}  // namespace ckpt::daemon
