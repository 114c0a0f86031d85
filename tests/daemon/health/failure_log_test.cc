// FailureLog: failures counted by cause, those of one incident counted
// once, recoveries stamped at the job's next save, the timeline bounded;
// TrainerExit reads how a real process ended (killed, exit code, still
// running, reaped).
#include "daemon/health/failure_log.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

TEST(FailureLogTest, CountsByCauseOneIncidentOnceAndStampsRecoveries) {
  Metrics metrics;
  FailureLog log(&metrics);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  log.Saved("j", 10, 0, t0);
  log.Failed("j", "trainer_exited", "rank 1 (pid 7) killed by signal 9",
             /*incident=*/true, t0 + absl::Seconds(1), /*rank=*/1);
  log.Saved("j", 11, 0, t0 + absl::Seconds(1));  // rank 0 goes on alone
  // Its peers stopped by the launcher: the same incident.
  log.Failed("j", "trainer_exited", "rank 0 (pid 6) killed by signal 15",
             /*incident=*/true, t0 + absl::Seconds(2));
  // A failed save during the incident is its own failure.
  log.Failed("j", "disk_error", "persist failed", /*incident=*/false,
             t0 + absl::Seconds(3));
  log.Saved("j", 8, 1, t0 + absl::Seconds(11));
  // A peer's exit noticed late, but it closed its session during the
  // incident: part of it.
  log.Failed("j", "trainer_exited", "rank 0 (pid 6) exited", true,
             t0 + absl::Seconds(5), 0);
  // Or noticed after the recovery, its session from before the incident.
  log.Failed("j", "trainer_exited", "rank 2 (pid 8) exited", true,
             t0 + absl::Seconds(12), 2, t0);
  log.Failed("j", "daemon_restart", "ckptd restarted", /*incident=*/true,
             t0 + absl::Seconds(20));
  std::vector<proto::FailureRecord> t = log.Timeline("j");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].cause(), "trainer_exited");
  EXPECT_EQ(t[0].detail(), "rank 1 (pid 7) killed by signal 9");
  EXPECT_EQ(t[0].step(), 10u);
  EXPECT_EQ(t[0].rank(), 1u);
  EXPECT_EQ(t[0].recovered_unix_micros() - t[0].unix_micros(), 10'000'000);
  EXPECT_EQ(t[1].cause(), "disk_error");
  EXPECT_EQ(t[2].cause(), "daemon_restart");
  EXPECT_EQ(t[2].step(), 11u) << "the newest step saved";
  EXPECT_FALSE(t[2].has_rank());
  EXPECT_EQ(t[2].recovered_unix_micros(), 0) << "not saved since";
  const std::string text = metrics.Render();
  EXPECT_THAT(
      text,
      HasSubstr("ckpt_failures_total{job=\"j\",cause=\"trainer_exited\"} 1"));
  EXPECT_THAT(
      text, HasSubstr("ckpt_failures_total{job=\"j\",cause=\"disk_error\"} 1"));
  EXPECT_TRUE(log.Timeline("other").empty());
  for (int i = 0; i < 40; ++i) {
    log.Failed("k", "disk_error", "again", false, t0 + absl::Seconds(i));
  }
  EXPECT_EQ(log.Timeline("k").size(), FailureLog::kKept);
  EXPECT_EQ(log.Timeline("").size(), FailureLog::kKept + 3);
}

TEST(FailureLogTest, EpisodesCountOnceAndTheHistorySurvivesARestart) {
  Metrics metrics;
  proto::FailureHistory kept;
  std::vector<std::string> incidents;
  FailureLog log(
      &metrics, [&](const proto::FailureHistory& h) { kept = h; },
      [&](const std::string& job, absl::Time, int, absl::Duration) {
        incidents.push_back(job);
      });
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // A failing disk: every persist fails until one succeeds.
  for (int i = 0; i < 5; ++i) {
    log.FailedEpisode("j", "disk_error", "ENOSPC", t0 + absl::Seconds(i));
  }
  log.Healed("j", "disk_error", t0 + absl::Seconds(6));
  log.FailedEpisode("j", "disk_error", "EIO", t0 + absl::Seconds(8));
  log.Failed("j", "trainer_exited", "rank 0 (pid 5) exited with code 3",
             /*incident=*/true, t0 + absl::Seconds(9), 0);
  EXPECT_EQ(incidents, std::vector<std::string>{"j"});
  EXPECT_EQ(kept.counts().at("disk_error"), 2u);
  EXPECT_EQ(kept.counts().at("trainer_exited"), 1u);
  ASSERT_EQ(kept.timeline_size(), 3);
  EXPECT_EQ(kept.timeline(0).recovered_unix_micros(),
            absl::ToUnixMicros(t0 + absl::Seconds(6)));
  EXPECT_TRUE(kept.open());

  // ckptd restarts: the counts go on, and the failing disk; the restart is
  // an incident of its own.
  Metrics metrics2;
  FailureLog again(&metrics2, nullptr,
                   [&](const std::string& job, absl::Time, int,
                       absl::Duration) { incidents.push_back(job); });
  again.Restore(kept);
  again.Failed("j", "daemon_restart", "ckptd restarted", /*incident=*/true,
               t0 + absl::Seconds(10));
  again.FailedEpisode("j", "disk_error", "EIO", t0 + absl::Seconds(11));
  EXPECT_EQ(incidents.size(), 2u) << "a new incident";
  EXPECT_EQ(again.Timeline("j").size(), 4u);
  EXPECT_THAT(metrics2.Render(),
              HasSubstr("ckpt_failures_total{job=\"j\",cause=\"disk_error\"} "
                        "2"));
  again.Saved("j", 12, 0, t0 + absl::Seconds(12));
  again.Failed("j", "daemon_restart", "ckptd restarted", true,
               t0 + absl::Seconds(30));
  EXPECT_EQ(incidents.size(), 3u);
  EXPECT_THAT(
      metrics2.Render(),
      HasSubstr("ckpt_failures_total{job=\"j\",cause=\"daemon_restart\"} 2"));
}

// A node's failures (lost, unreachable) are episodes of that node: two nodes
// away at once count twice, one node's return heals its own, and what is
// still away survives a restart.
TEST(FailureLogTest, EpisodesOfNodesAreTheirOwn) {
  Metrics metrics;
  proto::FailureHistory kept;
  FailureLog log(&metrics, [&](const proto::FailureHistory& h) {
    if (h.job() == "a") kept = h;
  });
  const absl::Time t0 = absl::FromUnixSeconds(2000);
  log.FailedEpisode("a", "node_lost", "n1's lease expired", t0, "n1");
  log.FailedEpisode("a", "node_lost", "n2's lease expired", t0, "n2");
  log.FailedEpisode("a", "node_lost", "again", t0 + absl::Seconds(1), "n1");
  log.FailedEpisode("b", "node_lost", "n1's lease expired", t0, "n1");
  log.FailedEpisode("a", "peer_unreachable", "no route", t0, "n1");
  EXPECT_EQ(kept.counts().at("node_lost"), 2u);
  EXPECT_THAT(
      metrics.Render(),
      HasSubstr("ckpt_failures_total{job=\"b\",cause=\"node_lost\"} 1"));
  // n1 is back: its episodes of every job heal, n2's and the unreachable
  // link do not.
  log.Healed("", "node_lost", t0 + absl::Seconds(5), "n1");
  std::map<std::string, int64_t> recovered;
  for (const proto::FailureRecord& r : log.Timeline("")) {
    EXPECT_EQ(r.node().empty(), false) << r.cause();
    recovered[r.job() + "/" + r.cause() + "/" + r.node()] =
        r.recovered_unix_micros();
  }
  const int64_t back = absl::ToUnixMicros(t0 + absl::Seconds(5));
  EXPECT_EQ(recovered["a/node_lost/n1"], back);
  EXPECT_EQ(recovered["b/node_lost/n1"], back);
  EXPECT_EQ(recovered["a/node_lost/n2"], 0);
  EXPECT_EQ(recovered["a/peer_unreachable/n1"], 0);
  EXPECT_THAT(
      std::vector<std::string>(kept.failing().begin(), kept.failing().end()),
      ::testing::UnorderedElementsAre("node_lost@n2", "peer_unreachable@n1"));
  // Restarted: n2 is still away (not counted again); n1 lost again is a new
  // episode.
  Metrics metrics2;
  FailureLog again(&metrics2);
  again.Restore(kept);
  again.FailedEpisode("a", "node_lost", "still", t0 + absl::Seconds(6), "n2");
  again.FailedEpisode("a", "node_lost", "lost again", t0 + absl::Seconds(7),
                      "n1");
  EXPECT_THAT(
      metrics2.Render(),
      HasSubstr("ckpt_failures_total{job=\"a\",cause=\"node_lost\"} 3"));
}

TEST(FailureLogTest, TrainerExitReadsHowAProcessEnded) {
  EXPECT_EQ(TrainerExit(static_cast<uint32_t>(::getpid())), "") << "running";
  const pid_t killed = ::fork();
  ASSERT_GE(killed, 0);
  if (killed == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_EQ(::kill(killed, SIGKILL), 0);
  siginfo_t info;
  // Wait for it to end without reaping it: a zombie keeps its status.
  ASSERT_EQ(::waitid(P_PID, killed, &info, WEXITED | WNOWAIT), 0);
  EXPECT_EQ(TrainerExit(static_cast<uint32_t>(killed)), "killed by signal 9");
  const pid_t failed = ::fork();
  ASSERT_GE(failed, 0);
  if (failed == 0) ::_exit(3);
  ASSERT_EQ(::waitid(P_PID, failed, &info, WEXITED | WNOWAIT), 0);
  EXPECT_EQ(TrainerExit(static_cast<uint32_t>(failed)), "exited with code 3");
  const pid_t clean = ::fork();
  ASSERT_GE(clean, 0);
  if (clean == 0) ::_exit(0);
  ASSERT_EQ(::waitid(P_PID, clean, &info, WEXITED | WNOWAIT), 0);
  EXPECT_EQ(TrainerExit(static_cast<uint32_t>(clean)), "") << "a clean exit";
  int status;
  for (pid_t p : {killed, failed, clean}) ::waitpid(p, &status, 0);
  EXPECT_EQ(TrainerExit(static_cast<uint32_t>(killed)), "exited")
      << "reaped: gone, how unknown";
}

TEST(FailureLogTest, ProcessStartReadsWhenAProcessWasLaunched) {
  const absl::Time before = absl::Now();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  absl::SleepFor(absl::Milliseconds(1200));
  std::optional<absl::Time> started =
      ProcessStart(static_cast<uint32_t>(child));
  ASSERT_TRUE(started.has_value());
  // To the kernel's clock tick (10 ms), and /proc/uptime's.
  EXPECT_GE(*started, before - absl::Milliseconds(30));
  EXPECT_LE(*started, before + absl::Milliseconds(500))
      << "not when it was read, 1.2 s later";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(ProcessStart(static_cast<uint32_t>(child)), std::nullopt);
}

}  // namespace
}  // namespace ckpt::daemon
