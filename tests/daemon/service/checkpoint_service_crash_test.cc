// SIGKILL of a real daemon process at every kill point of staging, persist,
// commit and garbage collection. After a restart: staged shards are persisted,
// every step committed at local disk restores byte-exact, nothing half-written
// is visible, and no temporary file is left.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/match.h"
#include "daemon/service/checkpoint_service.h"
#include "gtest/gtest.h"
#include "io/kill_point.h"
#include "tests/daemon/service_util.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using testing::RankState;

constexpr uint32_t kWorld = 2;
constexpr uint64_t kSteps = 4;

ServiceOptions Options(const testing::TempDir& dir) {
  ServiceOptions o = testing::TestServiceOptions(dir);
  o.staging.policy = FullPolicy::kWait;
  o.keep_disk_steps = 2;
  o.keep_memory_steps = 1;
  return o;
}

// What `rank` saves at `step`: fine-tuning, where only the first of the
// weights' four chunks changes, so steps after the first are incremental
// saves over it (ckptd's default --full-every 10).
RankState Saved(uint64_t step, uint32_t rank) {
  RankState state(1, rank);
  state.weights[rank * 4] = static_cast<uint8_t>(step);
  state.rng[0] = static_cast<uint8_t>(step);
  return state;
}

// The child: a daemon and its trainers in one process, saving kSteps steps,
// until the kill point fires (the n-th time it is reached).
[[noreturn]] void RunUntilKilled(const testing::TempDir& dir,
                                 const std::string& point, int n) {
  auto hits = std::make_shared<std::atomic<int>>(0);
  io::SetKillPointCallback([point, n, hits](absl::string_view name) {
    if (name == point && ++*hits == n) ::kill(::getpid(), SIGKILL);
  });
  auto service =
      CheckpointService::Start(io::DefaultFileSystem(), Options(dir));
  if (!service.ok()) ::_exit(3);
  for (uint64_t step = 1; step <= kSteps; ++step) {
    for (uint32_t rank = 0; rank < kWorld; ++rank) {
      if (!Saved(step, rank)
               .Stage(service->get(), "job", step, rank, kWorld)
               .ok())
        ::_exit(4);
    }
    if (!(*service)
             ->WaitCommitted("job", step, proto::TIER_LOCAL_DISK,
                             absl::Seconds(60))
             .ok()) {
      ::_exit(5);
    }
  }
  (*service)->WaitIdle();
  ::_exit(0);
}

TEST(CheckpointServiceCrashTest, SigkillAtEveryKillPointThenRestart) {
  const std::pair<const char*, int> points[] = {
      {"service.before_staged_record", 3},
      {"service.after_staged_record", 3},
      {"shard.chunk_written", 5},
      {"shard.before_sync", 2},
      {"shard.after_rename", 3},
      {"service.after_shard_commit", 4},
      {"service.after_persisted_record", 5},
      {"service.gc_after_catalog", 1},
  };
  for (const auto& [point, n] : points) {
    SCOPED_TRACE(std::string(point) + ":" + std::to_string(n));
    testing::TempDir dir;
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) RunUntilKilled(dir, point, n);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the daemon was not killed at " << point << " (exit "
        << WEXITSTATUS(status) << ")";

    auto service =
        CheckpointService::Start(io::DefaultFileSystem(), Options(dir));
    ASSERT_TRUE(service.ok()) << service.status();
    (*service)->WaitIdle();
    auto shards = (*service)->catalog()->ListShards("job");
    ASSERT_TRUE(shards.ok());
    for (const proto::ShardRecord& r : *shards) {
      EXPECT_NE(r.state(), proto::SHARD_STAGED)
          << "staged shard of step " << r.step()
          << " was not persisted after the restart";
      EXPECT_NE(r.state(), proto::SHARD_STAGING) << "incomplete slot kept";
      EXPECT_NE(r.state(), proto::SHARD_FAILED) << r.error();
    }
    // Garbage collection after the restart leaves no commit record whose
    // shards are all gone (a kill between forgetting the shards and the
    // records must not leave them behind forever).
    ASSERT_TRUE(
        (*service)
            ->CollectGarbage("job", {(*service)->options().keep_disk_steps,
                                     (*service)->options().keep_memory_steps})
            .ok());
    auto commits = (*service)->coordinator()->ListCommits("job");
    ASSERT_TRUE(commits.ok());
    auto kept = (*service)->catalog()->ListShards("job");
    ASSERT_TRUE(kept.ok());
    for (const proto::CommitRecord& c : *commits) {
      EXPECT_TRUE(std::any_of(
          kept->begin(), kept->end(),
          [&](const proto::ShardRecord& r) { return r.step() == c.step(); }))
          << "step " << c.step() << " is committed at "
          << proto::Tier_Name(c.tier()) << " but no shard of it is left";
    }
    int disk_commits = 0;
    for (const proto::CommitRecord& c : *commits) {
      if (c.tier() != proto::TIER_LOCAL_DISK) continue;
      ++disk_commits;
      for (uint32_t rank = 0; rank < kWorld; ++rank) {
        absl::Status ok =
            Saved(c.step(), rank)
                .Check((*service)->ShardPath("job", c.step(), rank));
        EXPECT_TRUE(ok.ok())
            << "committed step " << c.step() << " rank " << rank << ": " << ok;
      }
    }
    // A step some rank never finished staging never commits; the latest names a
    // committed step.
    auto latest = (*service)->LatestCommitted("job", proto::TIER_LOCAL_DISK);
    ASSERT_TRUE(latest.ok());
    if (disk_commits > 0) {
      ASSERT_TRUE(latest->has_value());
      EXPECT_TRUE((*service)
                      ->coordinator()
                      ->GetCommit("job", **latest, proto::TIER_LOCAL_DISK)
                      ->has_value());
    }
    auto files = io::DefaultFileSystem()->ListDir(dir.File("data/shards/job"));
    if (files.ok()) {
      for (const std::string& f : *files) {
        EXPECT_FALSE(absl::EndsWith(f, ".tmp")) << "temporary file left: " << f;
      }
    }
    std::cout << point << ":" << n << " -> " << disk_commits
              << " disk commits, latest "
              << (latest->has_value() ? std::to_string(**latest) : "none")
              << "\n";
  }
}

}  // namespace
}  // namespace ckpt::daemon
