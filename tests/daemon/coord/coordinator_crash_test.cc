// SIGKILL of a real process in the middle of voting: the coordination records
// stay consistent.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <iostream>
#include <random>

#include "daemon/catalog/kv_store.h"
#include "daemon/coord/embedded_coordinator.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

constexpr proto::Tier kMem = proto::TIER_MEMORY;
constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;

// A real process votes as fast as it can and is SIGKILLed at a random moment;
// afterwards every commit record is backed by all of its votes and the latest
// pointer names a committed step.
TEST(CoordinatorCrashTest, SigkillMidVotingLeavesConsistentRecords) {
  uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 5; ++round) {
    testing::TempDir dir;
    const std::string db = dir.File("db");
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto store = KvStore::Open(db);
      if (!store.ok()) ::_exit(3);
      EmbeddedCoordinator c(store->get());
      for (uint64_t step = 0;; ++step) {
        for (uint32_t r = 0; r < 4; ++r) {
          if (!c.Vote("job", step, r, 4, {kMem, kDisk}).ok()) ::_exit(4);
        }
      }
    }
    ::usleep(20000 + rng() % 200000);
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status))
        << "child exited early with " << WEXITSTATUS(status);

    auto store = KvStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    EmbeddedCoordinator c(store->get());
    auto commits = c.ListCommits("job");
    ASSERT_TRUE(commits.ok());
    uint64_t max_step = 0;
    for (const auto& commit : *commits) {
      max_step = std::max(max_step, commit.step());
      auto votes = (*store)->Scan(StepPrefix("job", commit.step()) + "votes/");
      ASSERT_TRUE(votes.ok());
      EXPECT_EQ(votes->size(), 4u)
          << "commit of step " << commit.step() << " without its votes";
    }
    auto latest = c.LatestCommitted("job", kMem);
    ASSERT_TRUE(latest.ok());
    if (!commits->empty()) {
      ASSERT_TRUE(latest->has_value());
      EXPECT_EQ(**latest, max_step);
    }
    std::cout << "round " << round << ": " << commits->size()
              << " commits before the kill\n";
  }
}

}  // namespace
}  // namespace ckpt::daemon
