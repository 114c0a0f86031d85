// SIGKILL of trainer ranks at random points of SaveAsync and staging, many
// seeded rounds against one real ckptd: each round starts a 2-rank job (real
// processes) that resumes from the latest step committed in memory — checking
// that it restored exactly that step's state — and saves every step until one
// rank dies at a client kill point or a timer kills the job. After every round:
// every committed step restores byte-exact for every rank, no other step is
// restorable, and the latest committed step never went backward. A last round
// runs the job to its end. CKPT_TRAINER_KILL_ROUNDS sets the number of rounds
// (a soak), CKPT_TEST_SEED replays one.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/checkpointer.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"
#include "tests/client/rank_state.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

constexpr uint32_t kWorld = 2;
constexpr int64_t kElements = 128 << 10;  // 512 KiB + 512 KiB per rank
constexpr uint64_t kMaxStep = 1000000;
constexpr size_t kKeepDisk = 3;

const char* const kKillPoints[] = {
    "client.after_begin_stage", "client.forked", "client.item_copied",
    "client.before_stage_complete", "client.after_stage_complete"};

// How a rank's saves capture its state: a copy by a helper thread, a fork
// (client/fork_snapshot.h; a kill then also stops a child writing a slot), or
// the GPU path's CPU twin (tensors "on a device": copies gathered and queued
// on the device's stream, a kill lands while they are in flight).
enum class Capture { kCopy, kFork, kDevice };

// Starts one rank; `kill_point` (may be empty) goes into its environment.
pid_t StartRank(const std::string& socket, uint32_t rank, uint64_t max_step,
                const std::string& kill_point, Capture capture) {
  std::vector<std::string> args = {TRAINER_HELPER,
                                   socket,
                                   "killjob",
                                   std::to_string(rank),
                                   std::to_string(kWorld),
                                   std::to_string(kElements),
                                   std::to_string(max_step)};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("CKPT_KILL_POINT=", 0) != 0 &&
        std::string(*e).rfind("CKPT_HOST_SNAPSHOT=", 0) != 0 &&
        std::string(*e).rfind("CKPT_TEST_DEVICE=", 0) != 0) {
      env.push_back(*e);
    }
  }
  env.push_back(capture == Capture::kFork ? "CKPT_HOST_SNAPSHOT=fork"
                                          : "CKPT_HOST_SNAPSHOT=copy");
  if (capture == Capture::kDevice) env.push_back("CKPT_TEST_DEVICE=cpu-queued");
  if (!kill_point.empty()) env.push_back("CKPT_KILL_POINT=" + kill_point);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  for (auto& e : env) envp.push_back(e.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execve(TRAINER_HELPER, argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// Exit code 4 means the rank restored a state other than the committed one.
std::string Describe(int status) {
  if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
  return absl::StrCat("exit ", WEXITSTATUS(status));
}

// The end of a daemon's log, for a failure message.
std::string Tail(const std::string& log) {
  constexpr size_t kTail = 8000;
  return log.size() <= kTail ? log : log.substr(log.size() - kTail);
}

struct Checker {
  std::vector<std::unique_ptr<Checkpointer>> ckpt;
  // Held by pointer: the Checkpointer keeps the addresses of the registered
  // state.
  std::vector<std::unique_ptr<testing::RankTensors>> state;

  explicit Checker(const std::string& socket) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      auto c = Checkpointer::Connect({"killjob", r, kWorld, socket});
      EXPECT_TRUE(c.ok()) << c.status();
      if (!c.ok()) return;
      ckpt.push_back(*std::move(c));
      state.push_back(
          std::make_unique<testing::RankTensors>(r, kWorld, kElements));
      EXPECT_TRUE(state.back()->Register(ckpt.back().get()).ok());
    }
  }

  // The daemon finishes what the dead ranks staged: wait until the committed
  // steps stop changing.
  std::vector<uint64_t> SettledCommits() {
    std::vector<uint64_t> last;
    for (int i = 0; i < 100; ++i) {
      absl::SleepFor(absl::Milliseconds(150));
      auto now = ckpt[0]->ListCommitted(proto::TIER_LOCAL_DISK);
      auto mem = ckpt[0]->ListCommitted(proto::TIER_MEMORY);
      EXPECT_TRUE(now.ok() && mem.ok());
      if (!now.ok() || !mem.ok()) return {};
      // Settled: every memory commit also reached disk, twice in a row.
      if (*now == last && !mem->empty() && mem->back() <= now->back()) {
        return *now;
      }
      last = *now;
    }
    return last;
  }

  // Whether `step` is committed at some tier now.
  bool CommittedNow(uint64_t step) {
    for (proto::Tier tier : {proto::TIER_MEMORY, proto::TIER_LOCAL_DISK}) {
      auto now = ckpt[0]->ListCommitted(tier);
      EXPECT_TRUE(now.ok()) << now.status();
      if (now.ok() && std::count(now->begin(), now->end(), step) > 0) {
        return true;
      }
    }
    return false;
  }

  // Whether `step`, listed as committed when `latest` was the latest, is no
  // longer listed because a step newer than `latest` was committed since.
  bool DroppedByANewerCommit(uint64_t step, uint64_t latest) {
    auto now = ckpt[0]->ListCommitted(proto::TIER_LOCAL_DISK);
    EXPECT_TRUE(now.ok()) << now.status();
    return now.ok() && !now->empty() && now->back() > latest &&
           std::count(now->begin(), now->end(), step) == 0;
  }
};

TEST(TrainerKillTest, SigkillAtRandomPointsOfSavingNeverExposesAPartialStep) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  int rounds = 24;
  if (const char* r = std::getenv("CKPT_TRAINER_KILL_ROUNDS")) {
    rounds = std::max(1, std::atoi(r));
  }
  testing::DaemonProcess daemon(
      {"--keep-memory", "2", "--keep-disk", std::to_string(kKeepDisk)});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Checker checker(daemon.socket());
  ASSERT_EQ(checker.ckpt.size(), kWorld);

  uint64_t latest_seen = 0, highest_step = 0, restores_checked = 0,
           dropped_by_retention = 0;
  int by_kill_point = 0;
  for (int round = 0; round <= rounds; ++round) {
    const bool last = round == rounds;
    std::vector<std::string> kill(kWorld);
    if (!last && rng() % 2 == 0) {
      kill[rng() % kWorld] = absl::StrCat(
          kKillPoints[rng() % std::size(kKillPoints)], ":", 1 + rng() % 6);
    }
    // The last round runs a few more steps to the end; others run "forever".
    const uint64_t max_step = last ? latest_seen + 5 : kMaxStep;
    const auto capture = static_cast<Capture>(rng() % 3);
    std::vector<pid_t> pids;
    for (uint32_t r = 0; r < kWorld; ++r) {
      pids.push_back(StartRank(daemon.socket(), r, max_step, kill[r], capture));
    }
    const absl::Time deadline =
        absl::Now() +
        (last ? absl::Seconds(120) : absl::Milliseconds(150 + rng() % 450));
    std::vector<int> status(kWorld, -1);
    bool any_dead = false;
    while (absl::Now() < deadline) {
      bool all_dead = true;
      for (uint32_t r = 0; r < kWorld; ++r) {
        if (status[r] != -1) continue;
        int st;
        if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
          status[r] = st;
          any_dead = true;
        } else {
          all_dead = false;
        }
      }
      // A rank that died at its kill point takes the job down with it.
      if (all_dead || (any_dead && !last)) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    for (uint32_t r = 0; r < kWorld; ++r) {
      if (status[r] != -1) continue;
      ::kill(pids[r], SIGKILL);
      ::waitpid(pids[r], &status[r], 0);
    }
    for (uint32_t r = 0; r < kWorld; ++r) {
      if (last) {
        ASSERT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)
            << "seed " << seed << ": rank " << r
            << " of the last round: " << Describe(status[r]) << "\n"
            << daemon.log();
      } else {
        ASSERT_FALSE(WIFEXITED(status[r]))
            << "seed " << seed << " round " << round << ": rank " << r
            << " exited by itself (" << Describe(status[r])
            << "; 4 = restored a wrong state)";
        if (!kill[r].empty() && status[r] != -1) ++by_kill_point;
      }
    }

    const std::vector<uint64_t> committed = checker.SettledCommits();
    if (committed.empty()) continue;  // killed before the first commit
    ASSERT_GE(committed.back(), latest_seen)
        << "seed " << seed << " round " << round
        << ": the latest committed step went backward";
    latest_seen = committed.back();
    // Every committed step retention keeps (the newest kKeepDisk; older ones
    // listed may be collected any moment, as garbage collection runs after
    // the persists) restores byte-exact on every rank. A killed rank's last
    // request may also still reach the daemon after the settle (the machine is
    // loaded) and commit a newer step, whose retention then drops the oldest
    // kept one: the only way a kept step may go missing.
    const std::vector<uint64_t> kept(
        committed.end() - std::min(committed.size(), kKeepDisk),
        committed.end());
    for (uint64_t step : kept) {
      for (uint32_t r = 0; r < kWorld; ++r) {
        checker.state[r]->Fill(0);
        absl::Status s = checker.ckpt[r]->Restore(step);
        if (absl::IsNotFound(s) &&
            checker.DroppedByANewerCommit(step, kept.back())) {
          ++dropped_by_retention;
          break;
        }
        ASSERT_TRUE(s.ok())
            << "seed " << seed << " round " << round << ": committed step "
            << step << " rank " << r << " (committed were "
            << absl::StrJoin(committed, ",") << "): " << s << "\n"
            << Tail(daemon.log());
        ASSERT_TRUE(checker.state[r]->Matches(step))
            << "seed " << seed << ": step " << step << " rank " << r << " ("
            << checker.state[r]->Mismatch(step) << ")";
        ++restores_checked;
      }
    }
    // Nothing newer than the latest commit is restorable: those steps are
    // partial (staged by one rank, or not persisted when the job died).
    for (uint64_t step = latest_seen + 1; step <= latest_seen + 3; ++step) {
      for (uint32_t r = 0; r < kWorld; ++r) {
        absl::Status s = checker.ckpt[r]->Restore(step);
        if (s.ok() && checker.CommittedNow(step)) continue;  // committed late
        EXPECT_FALSE(s.ok()) << "seed " << seed << ": uncommitted step " << step
                             << " rank " << r << " was restorable";
      }
    }
    highest_step = std::max(highest_step, latest_seen);
  }
  auto final_latest = checker.ckpt[0]->LatestCommitted(proto::TIER_LOCAL_DISK);
  ASSERT_TRUE(final_latest.ok() && final_latest->has_value());
  EXPECT_EQ(**final_latest, highest_step) << "the last round ran to its end";
  const std::string log = daemon.log();
  size_t replaced = 0;
  for (size_t at = log.find("replaced by a new save"); at != std::string::npos;
       at = log.find("replaced by a new save", at + 1)) {
    ++replaced;
  }
  std::printf(
      "trainer-kill: %d rounds (%d ended at a client kill point), latest "
      "committed step %llu, %llu restores checked (%llu steps dropped by a "
      "late newer commit), %zu uncommitted shards replaced by a re-save, "
      "seed %llu\n",
      rounds, by_kill_point, static_cast<unsigned long long>(highest_step),
      static_cast<unsigned long long>(restores_checked),
      static_cast<unsigned long long>(dropped_by_retention), replaced,
      static_cast<unsigned long long>(seed));
}

}  // namespace
}  // namespace ckpt::client
