#include "daemon/persist/retention.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

proto::CommitRecord Commit(uint64_t step, proto::Tier tier) {
  proto::CommitRecord c;
  c.set_job("j");
  c.set_step(step);
  c.set_tier(tier);
  return c;
}

proto::ShardRecord Shard(uint64_t step, proto::ShardState state, bool file,
                         bool slot) {
  proto::ShardRecord r;
  r.set_job("j");
  r.set_step(step);
  r.set_state(state);
  if (file) r.set_shard_path("f" + std::to_string(step));
  if (slot) r.set_slot_path("s" + std::to_string(step));
  return r;
}

constexpr auto kMem = proto::TIER_MEMORY;
constexpr auto kDisk = proto::TIER_LOCAL_DISK;
constexpr auto kPersisted = proto::SHARD_PERSISTED;

// What the plan does to each step: "F" file dropped, "S" slot dropped, "x"
// forgotten.
std::string Describe(const RetentionPlan& plan) {
  std::string out;
  for (const RetentionAction& a : plan.actions) {
    out += std::to_string(a.shard.step()) + ":" + (a.drop_file ? "F" : "") +
           (a.drop_slot ? "S" : "") + (a.forget() ? "x" : "") + " ";
  }
  return out;
}

// Steps 1..n committed in memory and on disk, each with its file and slot.
void CommittedSteps(uint64_t n, std::vector<proto::CommitRecord>* commits,
                    std::vector<proto::ShardRecord>* shards) {
  for (uint64_t s = 1; s <= n; ++s) {
    commits->push_back(Commit(s, kMem));
    commits->push_back(Commit(s, kDisk));
    shards->push_back(Shard(s, kPersisted, true, true));
  }
}

TEST(RetentionTest, NothingGoesBeforeADiskCommit) {
  RetentionPlan plan = PlanRetention(
      {Commit(1, kMem), Commit(2, kMem)},
      {Shard(1, kPersisted, true, true), Shard(2, kPersisted, true, true)},
      {1, 1});
  EXPECT_EQ(Describe(plan), "");
}

TEST(RetentionTest, KeepsTheNewestDiskCommitsAndMemoryCommits) {
  std::vector<proto::CommitRecord> commits;
  std::vector<proto::ShardRecord> shards;
  CommittedSteps(4, &commits, &shards);
  // Step 5 is committed in memory only and still being persisted; step 6 is
  // persisted but not committed anywhere yet.
  commits.push_back(Commit(5, kMem));
  shards.push_back(Shard(5, proto::SHARD_STAGED, false, true));
  shards.push_back(Shard(6, kPersisted, true, true));
  RetentionPlan plan = PlanRetention(commits, shards, {2, 1});
  EXPECT_EQ(plan.oldest_kept_disk_step, 3u);
  // Files of steps 1, 2 go (disk keeps 3, 4); slots go up to 4 (memory keeps
  // 5, the newest memory commit); step 6 may still be committed: kept.
  EXPECT_EQ(Describe(plan), "1:FSx 2:FSx 3:S 4:S ");
}

// The step an elastic epoch resumes from keeps every copy: its members may
// still be restoring it while newer steps commit.
TEST(RetentionTest, TheStepAnEpochResumesFromKeepsEveryCopy) {
  std::vector<proto::CommitRecord> commits;
  std::vector<proto::ShardRecord> shards;
  CommittedSteps(4, &commits, &shards);
  RetentionPolicy policy{2, 1};
  policy.resume_steps = {2};
  EXPECT_EQ(Describe(PlanRetention(commits, shards, policy)), "1:FSx 3:S ");
}

TEST(RetentionTest, ThePreviousMemoryCommitStaysUntilANewerOne) {
  RetentionPlan plan = PlanRetention(
      {Commit(1, kMem), Commit(1, kDisk), Commit(2, kMem)},
      {Shard(1, kPersisted, true, true), Shard(2, kPersisted, true, true)},
      {1, 2});
  EXPECT_EQ(Describe(plan), "") << "memory keeps 2 steps, disk keeps step 1";
}

// A staged shard whose persist was skipped (a newer save of its rank came
// first) loses its slot like a persisted one once a newer step is committed
// in memory; a plain staged one never.
TEST(RetentionTest, SkippedPersistsGoByTheMemoryRule) {
  proto::ShardRecord skipped = Shard(2, proto::SHARD_STAGED, false, true);
  skipped.set_persist_skipped(true);
  const std::vector<proto::CommitRecord> commits = {
      Commit(1, kMem), Commit(1, kDisk), Commit(2, kMem), Commit(3, kMem)};
  RetentionPlan plan =
      PlanRetention(commits,
                    {Shard(1, kPersisted, true, true), skipped,
                     Shard(3, proto::SHARD_STAGED, false, true)},
                    {1, 1});
  EXPECT_EQ(Describe(plan), "1:S 2:Sx ");
  // The newest memory commit itself stays.
  plan = PlanRetention({Commit(1, kMem), Commit(1, kDisk), Commit(2, kMem)},
                       {Shard(1, kPersisted, true, true), skipped}, {1, 1});
  EXPECT_EQ(Describe(plan), "1:S ");
}

TEST(RetentionTest, FailedShardsLoseTheirSlotOnceOlderThanTheCommits) {
  RetentionPlan plan =
      PlanRetention({Commit(2, kMem), Commit(2, kDisk)},
                    {Shard(1, proto::SHARD_FAILED, false, true),
                     Shard(2, kPersisted, true, true)},
                    {1, 1});
  EXPECT_EQ(Describe(plan), "1:Sx ");
}

TEST(RetentionTest, TheNewestStepHeldByPeersKeepsItsFiles) {
  // Steps 1-4 are on disk; 2 is the newest whose every shard K peers hold.
  std::vector<proto::CommitRecord> commits;
  std::vector<proto::ShardRecord> shards;
  for (uint64_t step = 1; step <= 4; ++step) {
    commits.push_back(Commit(step, kDisk));
    shards.push_back(Shard(step, kPersisted, true, false));
  }
  commits.push_back(Commit(1, proto::TIER_PEER));
  commits.push_back(Commit(2, proto::TIER_PEER));
  RetentionPlan plan = PlanRetention(commits, shards, {1, 1});
  EXPECT_EQ(plan.oldest_kept_disk_step, 4u);
  // Losing a peer must not lose step 2: its files stay; 1 and 3 go.
  EXPECT_EQ(Describe(plan), "1:Fx 3:Fx ");
}

TEST(RetentionTest, StepsThePeerTierMayStillCommitKeepTheirFiles) {
  // chaos three_node (two node losses close together): step 700 left the
  // disk window on node 1 while its replicas were still on the way; then it
  // became the newest peer commit, and the node holding rank 1's replica was
  // lost. No copy of rank 1's shard was left anywhere.
  std::vector<proto::CommitRecord> commits;
  std::vector<proto::ShardRecord> shards;
  for (uint64_t step = 1; step <= 6; ++step) {
    commits.push_back(Commit(step, kDisk));
    shards.push_back(Shard(step, kPersisted, true, false));
  }
  commits.push_back(Commit(2, proto::TIER_PEER));
  RetentionPolicy policy{1, 1};
  policy.peer_tier = true;
  RetentionPlan plan = PlanRetention(commits, shards, policy);
  EXPECT_EQ(plan.oldest_kept_disk_step, 6u);
  // 1 is older than the newest peer commit: nothing will fall back to it.
  EXPECT_EQ(Describe(plan), "1:Fx ");
  // Once 5 is committed at the peer tier, 2 to 4 may go.
  commits.push_back(Commit(5, proto::TIER_PEER));
  plan = PlanRetention(commits, shards, policy);
  EXPECT_EQ(Describe(plan), "1:Fx 2:Fx 3:Fx 4:Fx ");
}

TEST(RetentionTest, FilesThatKeptShardsStoreChunksInStay) {
  // Steps 1..6 committed; 1 is a full save, 2..5 increments over it, 6 full.
  // Step 5 (kept) stores chunks in 1 and 3; 3 stores chunks in 1 and 2.
  std::vector<proto::CommitRecord> commits;
  std::vector<proto::ShardRecord> shards;
  for (uint64_t s = 1; s <= 6; ++s) {
    commits.push_back(Commit(s, kDisk));
    shards.push_back(Shard(s, kPersisted, true, false));
  }
  shards[2].add_base_steps(1);
  shards[2].add_base_steps(2);
  shards[4].add_base_steps(1);
  shards[4].add_base_steps(3);
  // Keeping 5 and 6 keeps 3 (named by 5), and so 2 (named by 3) and 1.
  EXPECT_EQ(Describe(PlanRetention(commits, shards, {2, 1})), "4:Fx ");
  // Keeping only 6 (a full save) drops every older file.
  EXPECT_EQ(Describe(PlanRetention(commits, shards, {1, 1})),
            "1:Fx 2:Fx 3:Fx 4:Fx 5:Fx ");
  // A base pinned by a persist in flight stays, and so do its own bases.
  RetentionPolicy pinned{1, 1};
  pinned.pinned = {{0, 3}};
  EXPECT_EQ(Describe(PlanRetention(commits, shards, pinned)), "4:Fx 5:Fx ");
  // References are per rank: rank 1's step 3 does not keep rank 0's.
  pinned.pinned = {{1, 3}};
  EXPECT_EQ(Describe(PlanRetention(commits, shards, pinned)),
            "1:Fx 2:Fx 3:Fx 4:Fx 5:Fx ");
}

TEST(RetentionTest, StepListCollapsesRuns) {
  EXPECT_EQ(StepList({}), "none");
  EXPECT_EQ(StepList({3, 4, 5, 6, 7, 9, 11, 12}), "3-7,9,11-12");
}

}  // namespace
}  // namespace ckpt::daemon
