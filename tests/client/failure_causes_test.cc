// Failure causes end to end on a real ckptd with real trainer processes: a
// rank SIGKILLed (its peer then stopped, as a launcher does) is one failure,
// trainer_exited, named with the rank and the signal, recovered when the job
// saves again; trainers that finish (their Checkpointer closed) are none.
// Shown by `ckpt status --json` (counts by cause, the timeline), with the
// job's goodput: its wall time from launch to end, a recovery in it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/daemon_process.h"
#include "tests/tools/run_cli.h"

namespace ckpt::client {
namespace {

pid_t StartRank(const std::string& socket, uint32_t rank, uint64_t max_step) {
  std::vector<std::string> args = {TRAINER_HELPER,          socket, "causes",
                                   std::to_string(rank),    "2",    "4096",
                                   std::to_string(max_step)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execv(TRAINER_HELPER, argv.data());
    ::_exit(127);
  }
  return pid;
}

nlohmann::json Status(const testing::DaemonProcess& d) {
  Result r = RunCli("--data-dir " + d.data_dir() + " --socket " + d.socket() +
                    " status --json");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  for (const nlohmann::json& job : j["jobs"]) {
    if (job["job"] == "causes") return job;
  }
  ADD_FAILURE() << "no job \"causes\" in:\n" << r.out;
  return nlohmann::json();
}

TEST(FailureCausesTest, AKilledTrainerIsOneFailureNamedWithItsSignal) {
  testing::DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  CheckpointerOptions o{"causes", 0, 2, d.socket()};
  o.read_only = true;
  auto probe = Checkpointer::Connect(o);
  ASSERT_TRUE(probe.ok()) << probe.status();
  const absl::Time launched = absl::Now();
  pid_t r0 = StartRank(d.socket(), 0, 1'000'000),
        r1 = StartRank(d.socket(), 1, 1'000'000);
  // Until a few steps are committed.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (;;) {
    auto latest = (*probe)->LatestCommitted(proto::TIER_LOCAL_DISK);
    ASSERT_TRUE(latest.ok()) << latest.status();
    if (latest->value_or(0) >= 3) break;
    ASSERT_LT(absl::Now(), deadline) << d.log();
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Rank 1 dies; left unreaped (as a slow launcher would) until ckptd saw
  // it; then the launcher stops rank 0.
  ASSERT_EQ(::kill(r1, SIGKILL), 0);
  nlohmann::json job;
  for (;;) {
    job = Status(d);
    if (job.contains("failure_timeline") || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  int status;
  ::waitpid(r1, &status, 0);
  ::kill(r0, SIGTERM);
  ::waitpid(r0, &status, 0);
  ASSERT_TRUE(job.contains("failure_timeline")) << job.dump(2) << d.log();
  // The job resumes and finishes: its trainers close their sessions.
  auto latest = (*probe)->LatestCommitted(proto::TIER_MEMORY);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  const uint64_t last = **latest + 3;
  r0 = StartRank(d.socket(), 0, last);
  r1 = StartRank(d.socket(), 1, last);
  ::waitpid(r0, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ::waitpid(r1, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const double ran = absl::ToDoubleSeconds(absl::Now() - launched);
  probe->reset();
  absl::SleepFor(absl::Seconds(1));  // sessions closing are looked at
  job = Status(d);
  ASSERT_EQ(job["failure_timeline"].size(), 1u) << job.dump(2);
  const nlohmann::json& f = job["failure_timeline"][0];
  EXPECT_EQ(f["cause"], "trainer_exited");
  EXPECT_THAT(f["detail"].get<std::string>(),
              ::testing::MatchesRegex("rank 1 \\(pid [0-9]+\\) killed by "
                                      "signal 9"));
  EXPECT_GT(f.value("recovery_s", 0.0), 0) << job.dump(2);
  EXPECT_EQ(job["figures"]["failures_by_cause"],
            nlohmann::json({{"trainer_exited", 1}}))
      << job.dump(2);
  // Goodput: the job's wall time, from its first trainers' launch to its
  // last ones' end (the clock stopped then), split into parts; the kill cost
  // a recovery.
  const nlohmann::json& g = job["figures"]["goodput"];
  EXPECT_NEAR(g.value("wall_s", 0.0), ran, 0.25) << job.dump(2);
  EXPECT_GT(g.value("recovery_s", 0.0), 0) << job.dump(2);
  EXPECT_GT(g.value("training_s", 0.0), 0) << job.dump(2);
  EXPECT_GE(g.value("lost_s", -1.0), 0) << job.dump(2);
  EXPECT_NEAR(g.value("training_s", 0.0) + g.value("stall_s", 0.0) +
                  g.value("recovery_s", 0.0) + g.value("lost_s", 0.0),
              g.value("wall_s", 0.0), 1e-6);
  const double ettr = job["figures"].value("ettr", 0.0);
  EXPECT_GT(ettr, 0);
  EXPECT_LT(ettr, 1);
  EXPECT_EQ(Status(d)["figures"]["goodput"]["wall_s"], g["wall_s"])
      << "the job ended: its clock stopped";
  Result human = RunCli("--data-dir " + d.data_dir() + " --socket " +
                        d.socket() + " status");
  EXPECT_THAT(human.out, ::testing::HasSubstr("goodput    ETTR 0."));
  EXPECT_THAT(human.out, ::testing::HasSubstr("causes     trainer_exited 1"));
  EXPECT_THAT(human.out, ::testing::HasSubstr("trainer_exited: rank 1"));
}

}  // namespace
}  // namespace ckpt::client
