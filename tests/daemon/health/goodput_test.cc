// Goodput: a job's wall time split into training, stall, recovery and lost
// work, exactly, from the events ckptd sees; the split kept across a restart
// (the daemon's downtime counted as recovery); a randomized run whose parts
// always add up to the time its clock ran (seed printed).
#include "daemon/health/goodput.h"

#include <cstdio>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;

absl::Time T(double seconds) {
  return absl::FromUnixMicros(1'000'000'000'000 +
                              static_cast<int64_t>(seconds * 1e6));
}

TEST(GoodputTest, SplitsWallTimeIntoTrainingStallRecoveryAndLostWork) {
  Metrics metrics;
  std::vector<proto::GoodputRecord> kept;
  Goodput g(&metrics,
            [&](const proto::GoodputRecord& r) { kept.push_back(r); });
  g.SessionBegun("j", 101, T(0), T(0));
  g.SessionBegun("j", 102, T(0.5), T(0.5));
  // Step 10 saved at 10 s by both ranks; their copies overlap (1 s stall).
  g.StagingBegun("j", 10, 0, T(10));
  g.StagingBegun("j", 10, 1, T(10.2));
  g.Staged("j", 0, T(10.8));
  g.Staged("j", 1, T(11));
  // Step 20: 0.5 s.
  g.StagingBegun("j", 20, 0, T(20));
  g.StagingBegun("j", 20, 1, T(20));
  g.Staged("j", 0, T(20.5));
  g.Staged("j", 1, T(20.5));
  // A rank dies at 25 s; its peer is stopped; restarted ranks restore step 20
  // (resume) at 31 s and 32 s, then redo work until their save at 40 s.
  g.Failed("j", T(25));
  g.SessionEnded("j", 101, T(25.1), /*clean=*/false);
  g.SessionEnded("j", 102, T(25.2), /*clean=*/false);
  g.SessionBegun("j", 103, T(30), T(30));
  g.SessionBegun("j", 104, T(30), T(30));
  // The end of a session this ckptd never had (with its predecessor) while
  // others are open: the clock runs on.
  g.SessionEnded("j", 999, T(30.5), /*clean=*/true);
  g.Resumed("j", 20, T(31));
  g.Resumed("j", 20, T(32));
  g.StagingBegun("j", 30, 0, T(40));
  g.Staged("j", 0, T(40.25));
  Goodput::Split s = g.Of("j", T(50));
  // Stall 1 + 0.5 + 0.25; recovery 25..32 (the redone work after the last
  // resume is training); lost: the training between step 20's save and the
  // failure, 25 - 20.5 = 4.5 s; training: 50 - 1.75 - 7 - 4.5.
  EXPECT_THAT(s.stall, DoubleNear(1.75, 1e-9));
  EXPECT_THAT(s.recovery, DoubleNear(7, 1e-9));
  EXPECT_THAT(s.lost, DoubleNear(4.5, 1e-9));
  EXPECT_THAT(s.training, DoubleNear(36.75, 1e-9));
  EXPECT_THAT(s.wall(), DoubleNear(50, 1e-9));
  EXPECT_THAT(s.ettr(), DoubleNear(36.75 / 50, 1e-9));
  // The job ends cleanly at 60 s: its clock stops.
  g.SessionEnded("j", 103, T(60), /*clean=*/true);
  g.SessionEnded("j", 104, T(60), /*clean=*/true);
  EXPECT_THAT(g.Of("j", T(100)).wall(), DoubleNear(60, 1e-9));
  ASSERT_FALSE(kept.empty());
  EXPECT_FALSE(kept.back().running());
  // It starts again: the trainer's start-up (launched at 98 s, its session
  // at 100 s) counts as recovery.
  g.SessionBegun("j", 105, T(100), T(98));
  s = g.Of("j", T(110));
  EXPECT_THAT(s.recovery, DoubleNear(7 + 2, 1e-9));
  EXPECT_THAT(s.wall(), DoubleNear(72, 1e-9));
  g.SessionEnded("j", 105, T(110), /*clean=*/true);
  const std::string text = metrics.Render();
  EXPECT_THAT(text,
              HasSubstr("ckpt_goodput_seconds{job=\"j\",kind=\"lost\"} 4.5"));
  EXPECT_THAT(text, HasSubstr("ckpt_ettr{job=\"j\"} 0.78"));  // 56.75 / 72
}

TEST(GoodputTest, ARestartedDaemonCountsItsDowntimeAsRecovery) {
  Metrics metrics;
  proto::GoodputRecord last;
  {
    Goodput g(&metrics, [&](const proto::GoodputRecord& r) { last = r; });
    g.SessionBegun("j", 101, T(0), T(0));
    g.StagingBegun("j", 5, 0, T(5));
    g.Staged("j", 0, T(6));
    g.Failed("j", T(7));  // kept at once
  }
  EXPECT_TRUE(last.running());
  Metrics metrics2;
  Goodput g(&metrics2, nullptr);
  g.Restore(last, T(9));
  EXPECT_EQ(g.WasRunning("j"), true);
  EXPECT_EQ(g.WasRunning("other"), std::nullopt);
  // The restarted rank resumes from step 5 and trains again.
  g.Resumed("j", 5, T(9.5));
  g.StagingBegun("j", 6, 0, T(10));  // the recovery ends at the resume
  g.Staged("j", 0, T(10.5));
  Goodput::Split s = g.Of("j", T(12));
  EXPECT_THAT(s.recovery, DoubleNear(2.5, 1e-9));
  EXPECT_THAT(s.stall, DoubleNear(1.5, 1e-9));
  EXPECT_THAT(s.lost, DoubleNear(1, 1e-9)) << "from step 5's save to 7 s";
  EXPECT_THAT(s.training, DoubleNear(7, 1e-9));
  EXPECT_THAT(s.wall(), DoubleNear(12, 1e-9));

  // ckptd went down under trainers that went on (they saved again without
  // a resume): its downtime was their training.
  proto::GoodputRecord live;
  live.set_job("m");
  live.set_running(true);
  live.set_training_s(10);
  live.set_mark_unix_micros(absl::ToUnixMicros(T(10)));
  g.Restore(live, T(14));
  g.StagingBegun("m", 7, 0, T(15));
  Goodput::Split m = g.Of("m", T(15));
  EXPECT_THAT(m.training, DoubleNear(15, 1e-9));
  EXPECT_THAT(m.recovery, DoubleNear(0, 1e-9));
  // Had they restarted (a resume), it would have been recovery.
  live.set_job("n");
  g.Restore(live, T(14));
  g.Resumed("n", 6, T(14.5));
  g.StagingBegun("n", 7, 0, T(15));
  EXPECT_THAT(g.Of("n", T(15)).recovery, DoubleNear(4.5, 1e-9));

  // A job that had ended: its clock does not run while the daemon is down.
  proto::GoodputRecord ended = last;
  ended.set_job("k");
  ended.set_running(false);
  ended.set_recovering(false);
  g.Restore(ended, T(100));
  EXPECT_EQ(g.WasRunning("k"), false);
  EXPECT_THAT(
      g.Of("k", T(200)).wall(),
      DoubleNear(last.training_s() + last.stall_s() + last.recovery_s(), 1e-9));
}

TEST(GoodputTest, ARanksFailureLastsUntilThatRankSavesAgain) {
  Metrics metrics;
  Goodput g(&metrics, nullptr);
  g.SessionBegun("j", 101, T(0), T(0));
  g.SessionBegun("j", 102, T(0), T(0));
  g.Failed("j", T(10), /*rank=*/1);  // rank 1 hangs; rank 0 goes on
  g.StagingBegun("j", 1, 0, T(11));
  g.Staged("j", 0, T(11.5));
  g.StagingBegun("j", 1, 1, T(14));  // rank 1 is back
  g.Staged("j", 1, T(14.5));
  const Goodput::Split s = g.Of("j", T(20));
  EXPECT_THAT(s.recovery, DoubleNear(4, 1e-9));
  EXPECT_THAT(s.stall, DoubleNear(0.5, 1e-9));
  EXPECT_THAT(s.training, DoubleNear(15.5, 1e-9));
}

// A hang is seen long after the job stopped: the silence before it was seen
// (less the interval the rank may still have trained) is recovery, not
// training; the wall time is unchanged.
TEST(GoodputTest, AHangSeenLateCountsItsSilenceAsRecovery) {
  Metrics metrics;
  Goodput g(&metrics, nullptr);
  g.SessionBegun("j", 101, T(0), T(0));
  g.StagingBegun("j", 1, 0, T(9));
  g.Staged("j", 0, T(10));
  // Seen at 40 s, silent since its save at 9 s, saving every 1 s.
  g.Failed("j", T(40), 0, absl::Seconds(30));
  g.StagingBegun("j", 2, 0, T(45));
  g.Staged("j", 0, T(46));
  const Goodput::Split s = g.Of("j", T(50));
  EXPECT_THAT(s.wall(), DoubleNear(50, 1e-9));
  EXPECT_THAT(s.recovery, DoubleNear(35, 1e-9));
  EXPECT_THAT(s.stall, DoubleNear(2, 1e-9));
  EXPECT_THAT(s.training, DoubleNear(13, 1e-9));
}

TEST(GoodputTest, RandomEventsAlwaysAddUpToTheRunningClock) {
  const uint64_t seed = std::random_device{}();
  std::printf("GoodputTest seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  Metrics metrics;
  Goodput g(&metrics, nullptr);
  int64_t t = 0, running_since = 0, ran = 0;  // microseconds
  std::vector<uint32_t> sessions;             // pids
  uint32_t next_pid = 100;
  bool running = false, recovering = false;
  uint64_t step = 0;
  for (int i = 0; i < 2000; ++i) {
    t += std::uniform_int_distribution<int64_t>(0, 2'000'000)(rng);
    const absl::Time at = absl::FromUnixMicros(1'000'000'000'000 + t);
    const int what = std::uniform_int_distribution<int>(0, 6)(rng);
    const uint32_t rank = std::uniform_int_distribution<uint32_t>(0, 3)(rng);
    if (what == 0) {
      if (!running) running_since = t;
      running = true;
      sessions.push_back(++next_pid);
      g.SessionBegun("j", next_pid, at, at);
    } else if (what == 1 && !sessions.empty()) {
      const size_t which =
          std::uniform_int_distribution<size_t>(0, sessions.size() - 1)(rng);
      const uint32_t pid = sessions[which];
      sessions.erase(sessions.begin() + which);
      const bool clean = std::uniform_int_distribution<int>(0, 1)(rng) == 1;
      g.SessionEnded("j", pid, at, clean);
      if (sessions.empty() && (!recovering || clean) && running) {
        ran += t - running_since;
        running = recovering = false;
      }
    } else if (what == 2) {
      if (!running) running_since = t;
      running = true;
      recovering = false;
      g.StagingBegun("j", ++step, rank, at);
    } else if (what == 3) {
      g.Staged("j", rank, at);
    } else if (what == 4) {
      if (!running) running_since = t;
      running = recovering = true;
      g.Failed("j", at);
    } else if (what == 5) {
      g.Resumed("j", std::uniform_int_distribution<uint64_t>(0, step)(rng), at);
    }
    const Goodput::Split s = g.Of("j", at);
    ASSERT_THAT(
        s.wall(),
        DoubleNear((ran + (running ? t - running_since : 0)) / 1e6, 1e-6))
        << "event " << i << " (seed " << seed << ")";
    ASSERT_GE(s.training, -1e-9);
    ASSERT_GE(s.lost, 0);
    ASSERT_GE(s.recovery, -1e-9);
  }
}

}  // namespace
}  // namespace ckpt::daemon
