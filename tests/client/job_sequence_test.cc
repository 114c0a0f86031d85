// The memory tier as a cache, through a real ckptd and real trainers: a
// trainer's session lasts as long as its Checkpointer or its process; jobs run
// one after another on a small budget each save with the memory of the idle
// ones, whose steps still restore, from disk; an idle job gives up its memory
// after --idle-job-memory-ttl; an operator drops a job's memory copies.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/connected_rank.h"
#include "tests/client/daemon_process.h"
#include "tests/test_util.h"
#include "tests/tools/run_cli.h"

namespace ckpt::client {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kFloats = 100000;
// A slot: the tensor and the RNG item, each at an aligned offset.
constexpr uint64_t kSlot = kFloats * 4 + 64;

// One rank of a job: a float tensor (its box of a global vector) and an RNG
// string, filled from the job, step and rank.
struct Rank {
  std::vector<float> w = std::vector<float>(kFloats);
  std::string rng;
  std::unique_ptr<Checkpointer> ckpt;

  Rank(const std::string& socket, const std::string& job, uint32_t rank,
       uint32_t world) {
    ckpt =
        ConnectRank({job, rank, world, socket},
                    {w.data(), kFloats * world, kFloats * rank, kFloats, &rng});
  }
  static std::vector<float> Expected(const std::string& job, uint64_t step,
                                     uint32_t rank) {
    std::vector<float> w(kFloats);
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<float>((job[0] * 31 + step * 7 + i + rank) % 1000);
    return w;
  }
  void Fill(const std::string& job, uint64_t step, uint32_t rank) {
    const std::vector<float> e = Expected(job, step, rank);
    std::copy(e.begin(), e.end(), w.begin());  // w's buffer is registered
    rng = absl::StrCat(job, "-", step, "-", rank);
  }
};

// The value of one series in the daemon's metrics (0 when absent).
double Metric(const std::string& socket, const std::string& series) {
  auto text = GetMetricsText(socket);
  if (!text.ok()) return -1;
  size_t at = text->find("\n" + series + " ");
  if (at == std::string::npos) return 0;
  return std::stod(text->substr(at + series.size() + 2));
}

// Polls a metric until it has `value` (up to 20 s); returns the last value.
double AwaitMetric(const std::string& socket, const std::string& series,
                   double value) {
  double v = Metric(socket, series);
  for (int i = 0; i < 200 && v != value; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    v = Metric(socket, series);
  }
  return v;
}

// A job of two ranks saves steps 1..3, each committed on disk, and ends.
void RunJob(const testing::DaemonProcess& daemon, const std::string& job) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<Rank>(daemon.socket(), job, r, 2));
    ASSERT_TRUE(ranks.back()->ckpt);
  }
  for (uint64_t step = 1; step <= 3; ++step) {
    std::vector<std::shared_ptr<SaveHandle>> saves;
    for (uint32_t r = 0; r < 2; ++r) {
      ranks[r]->Fill(job, step, r);
      auto save = ranks[r]->ckpt->SaveAsync(step);
      ASSERT_TRUE(save.ok())
          << job << " step " << step << ": " << save.status() << daemon.log();
      saves.push_back(*std::move(save));
    }
    for (auto& save : saves) {
      absl::Status s = save->WaitCommitted(proto::TIER_LOCAL_DISK);
      ASSERT_TRUE(s.ok()) << job << " step " << step << ": " << s
                          << daemon.log();
    }
  }
  ranks.clear();  // the job ends: its trainers detach
  const std::string attached =
      absl::StrCat("ckpt_trainers_attached{job=\"", job, "\"}");
  ASSERT_EQ(AwaitMetric(daemon.socket(), attached, 0), 0);
}

TEST(JobSequenceTest, ASessionEndsWithItsCheckpointerOrItsProcess) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const std::string attached = "ckpt_trainers_attached{job=\"job\"}";
  {
    Rank rank(daemon.socket(), "job", 0, 1);
    ASSERT_TRUE(rank.ckpt);
    EXPECT_EQ(AwaitMetric(daemon.socket(), attached, 1), 1);
  }
  EXPECT_EQ(AwaitMetric(daemon.socket(), attached, 0), 0);
  // A trainer process SIGKILLed mid-training: its connection closes.
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl(TRAINER_HELPER, TRAINER_HELPER, daemon.socket().c_str(), "job", "0",
            "1", "1000", "100000000", nullptr);
    ::_exit(127);
  }
  EXPECT_EQ(AwaitMetric(daemon.socket(), attached, 1), 1);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_EQ(AwaitMetric(daemon.socket(), attached, 0), 0);
  // A daemon restart: a living Checkpointer attaches again.
  Rank rank(daemon.socket(), "job", 0, 1);
  ASSERT_TRUE(rank.ckpt);
  daemon.Kill();
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  EXPECT_EQ(AwaitMetric(daemon.socket(), attached, 1), 1);
}

// The user's report: a daemon with room for three jobs' latest steps; jobs
// run one after another; the fourth could not save. Now every save succeeds,
// the idle jobs' copies give way, and their steps still restore exactly.
TEST(JobSequenceTest, JobsInSequenceSaveWithTheMemoryOfIdleOnes) {
  testing::DaemonProcess daemon(
      {"--memory-budget", std::to_string(6 * kSlot + 1000), "--full-policy",
       "wait", "--wait-timeout", "20", "--keep-memory", "1"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  for (const char* job : {"a", "b", "c", "d"}) {
    ASSERT_NO_FATAL_FAILURE(RunJob(daemon, job)) << job;
  }
  const std::string evicted = "ckpt_memory_evictions_total{job=\"a\",reason=";
  EXPECT_EQ(Metric(daemon.socket(), evicted + "\"idle_job\"}"), 2)
      << daemon.log();
  EXPECT_EQ(Metric(daemon.socket(), "ckpt_steps_skipped_total{job=\"d\"}"), 0);
  // a's step 3, evicted from memory, restores from disk.
  for (uint32_t r = 0; r < 2; ++r) {
    Rank rank(daemon.socket(), "a", r, 2);
    ASSERT_TRUE(rank.ckpt);
    absl::Status s = rank.ckpt->Restore(3);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(rank.w, Rank::Expected("a", 3, r));
    EXPECT_EQ(rank.rng, absl::StrCat("a-3-", r));
  }
  EXPECT_GT(
      Metric(daemon.socket(),
             "ckpt_restored_bytes_total{job=\"a\",source=\"local_disk\"}"),
      0);
  // The operator: d's copies, safe on disk, go by hand.
  Result gc = RunCli(absl::StrCat("gc d --memory --socket ", daemon.socket()));
  EXPECT_EQ(gc.exit_code, 0) << gc.out;
  EXPECT_THAT(gc.out, HasSubstr("job d: dropped 2 memory-tier copies, kept 0"));
  Result status = RunCli(absl::StrCat("--data-dir ", daemon.data_dir(),
                                      " status --socket ", daemon.socket()));
  EXPECT_EQ(status.exit_code, 0) << status.out;
  EXPECT_THAT(status.out,
              HasSubstr("copies dropped while safe elsewhere: 2 idle_job"));
  Result bad =
      RunCli(absl::StrCat("gc d --memory --keep 2 --socket ", daemon.socket()));
  EXPECT_NE(bad.exit_code, 0) << bad.out;
}

TEST(JobSequenceTest, AnIdleJobGivesUpItsMemoryAfterTheTtl) {
  testing::DaemonProcess daemon({"--idle-job-memory-ttl", "1"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  ASSERT_NO_FATAL_FAILURE(RunJob(daemon, "a"));
  EXPECT_EQ(AwaitMetric(daemon.socket(),
                        "ckpt_memory_evictions_total{job=\"a\",reason="
                        "\"idle_ttl\"}",
                        2),
            2);
  EXPECT_EQ(Metric(daemon.socket(), "ckpt_memory_tier_bytes"), 0);
  Rank rank(daemon.socket(), "a", 1, 2);
  ASSERT_TRUE(rank.ckpt);
  ASSERT_TRUE(rank.ckpt->Restore(3).ok());
  EXPECT_EQ(rank.w, Rank::Expected("a", 3, 1));
}

// A run killed while saving step 2 leaves rank 0's shard of it staged and
// voted, rank 1's missing. The restarted run resumes from step 1: rank 0's
// restore withdraws its stale shard, so rank 1's new save of step 2 does not
// commit it together with the killed run's; the step commits with the new
// run's shards. A read-only checkpointer's restore withdraws nothing.
TEST(JobSequenceTest, AResumedRunNeverCommitsWithTheKilledRunsShards) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const std::string job = "resume";
  {
    Rank r0(daemon.socket(), job, 0, 2), r1(daemon.socket(), job, 1, 2);
    ASSERT_TRUE(r0.ckpt && r1.ckpt);
    std::vector<std::shared_ptr<SaveHandle>> saves;
    for (Rank* r : {&r0, &r1}) {
      r->Fill(job, 1, r == &r0 ? 0 : 1);
      auto save = r->ckpt->SaveAsync(1);
      ASSERT_TRUE(save.ok()) << save.status();
      saves.push_back(*save);
    }
    for (auto& save : saves)
      ASSERT_TRUE(save->WaitCommitted(proto::TIER_MEMORY).ok());
    r0.Fill("killed", 2, 0);  // the killed run's step 2: other bytes
    auto stale = r0.ckpt->SaveAsync(2);
    ASSERT_TRUE(stale.ok()) << stale.status();
    ASSERT_TRUE((*stale)->WaitStaged().ok());
    r0.ckpt.reset();  // hands the staged shard over, then "dies"
  }
  // A reader restoring step 1 (a tool, a probe) leaves the shard alone.
  {
    Rank reader(daemon.socket(), job, 0, 2);
    ASSERT_TRUE(reader.ckpt);
    auto ro = Checkpointer::Connect({.job = job,
                                     .rank = 0,
                                     .world_size = 2,
                                     .socket_path = daemon.socket(),
                                     .read_only = true});
    ASSERT_TRUE(ro.ok()) << ro.status();
    std::vector<float> w(kFloats);
    std::string rng;
    ASSERT_TRUE((*ro)
                    ->RegisterTensor("model/w", proto::DTYPE_FLOAT32, w.data(),
                                     {kFloats * 2}, {0}, {kFloats})
                    .ok());
    ASSERT_TRUE((*ro)->RegisterBytes("rng", &rng).ok());
    ASSERT_TRUE((*ro)->Restore(1).ok());
    auto shard = (*ro)->DescribeShard(2);
    ASSERT_TRUE(shard.ok())
        << "a read-only restore withdrew step 2: " << shard.status();
  }
  // The restarted run: every rank restores step 1, then saves step 2.
  Rank r0(daemon.socket(), job, 0, 2), r1(daemon.socket(), job, 1, 2);
  ASSERT_TRUE(r0.ckpt && r1.ckpt);
  ASSERT_TRUE(r0.ckpt->Restore(1).ok());
  ASSERT_TRUE(r1.ckpt->Restore(1).ok());
  EXPECT_EQ(
      Metric(daemon.socket(), "ckpt_shards_withdrawn_total{job=\"resume\"}"),
      1);
  r1.Fill(job, 2, 1);
  auto save1 = r1.ckpt->SaveAsync(2);
  ASSERT_TRUE(save1.ok()) << save1.status();
  ASSERT_TRUE((*save1)->WaitStaged().ok());
  absl::SleepFor(absl::Milliseconds(300));
  auto latest = r1.ckpt->LatestCommitted(proto::TIER_MEMORY);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->value_or(0), 1u)
      << "step 2 committed with the killed run's shard of rank 0";
  r0.Fill(job, 2, 0);
  auto save0 = r0.ckpt->SaveAsync(2);
  ASSERT_TRUE(save0.ok()) << save0.status() << daemon.log();
  ASSERT_TRUE((*save0)->WaitCommitted(proto::TIER_MEMORY).ok());
  std::fill(r0.w.begin(), r0.w.end(), -1.0f);
  ASSERT_TRUE(r0.ckpt->Restore(2).ok());
  EXPECT_EQ(r0.w, Rank::Expected(job, 2, 0));
}

}  // namespace
}  // namespace ckpt::client
