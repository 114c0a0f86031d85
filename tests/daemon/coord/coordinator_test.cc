// The embedded coordinator's commit rule, its durability across a reopen and a
// SIGKILL, and its refusals.
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/catalog/kv_store.h"
#include "daemon/coord/embedded_coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr proto::Tier kMem = proto::TIER_MEMORY;
constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }
  void Reopen() {
    coordinator_.reset();
    store_.reset();
    auto store = KvStore::Open(dir_.File("db"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    coordinator_ = std::make_unique<EmbeddedCoordinator>(store_.get());
  }
  std::vector<proto::Tier> Vote(uint64_t step, uint32_t rank, uint32_t world,
                                std::vector<proto::Tier> tiers) {
    auto r = coordinator_->Vote("job", step, rank, world, tiers);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::vector<proto::Tier>{};
  }

  testing::TempDir dir_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<EmbeddedCoordinator> coordinator_;
};

TEST_F(CoordinatorTest, CommitsWhenEveryRankVotedThatTier) {
  EXPECT_THAT(Vote(10, 0, 3, {kMem}), IsEmpty());
  EXPECT_THAT(Vote(10, 2, 3, {kMem, kDisk}), IsEmpty());
  EXPECT_FALSE(coordinator_->LatestCommitted("job", kMem)->has_value());
  EXPECT_THAT(Vote(10, 1, 3, {kMem}), ElementsAre(kMem));
  EXPECT_EQ(*coordinator_->LatestCommitted("job", kMem).value(), 10u);
  EXPECT_FALSE(coordinator_->LatestCommitted("job", kDisk)->has_value());
  // Later votes add tiers; earlier ones are kept.
  EXPECT_THAT(Vote(10, 0, 3, {kDisk}), ElementsAre(kMem));
  EXPECT_THAT(Vote(10, 1, 3, {kDisk}), ElementsAre(kMem, kDisk));
  auto commit = coordinator_->GetCommit("job", 10, kDisk);
  ASSERT_TRUE(commit.ok() && commit->has_value());
  EXPECT_EQ((*commit)->world_size(), 3u);
  EXPECT_GT((*commit)->committed_unix_micros(), 0);
}

// A replicator behind asks which steps after its latest peer commit others
// replicated.
TEST_F(CoordinatorTest, StepsVotedAtATierAfterAStep) {
  Vote(3, 0, 2, {kMem, proto::TIER_PEER});
  Vote(5, 1, 2, {kMem});
  Vote(7, 1, 2, {proto::TIER_PEER});
  Vote(12, 0, 2, {proto::TIER_PEER});
  auto all = coordinator_->StepsVotedAt("job", proto::TIER_PEER, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre(3, 7, 12));
  EXPECT_THAT(*coordinator_->StepsVotedAt("job", proto::TIER_PEER, 7),
              ElementsAre(12));
  EXPECT_THAT(*coordinator_->StepsVotedAt("job", kMem, 3), ElementsAre(5));
}

TEST_F(CoordinatorTest, CommitsSurviveAReopenAndLatestNeverGoesBackward) {
  Vote(5, 0, 1, {kMem});
  Vote(3, 0, 1, {kMem});  // an older step committed late
  EXPECT_EQ(*coordinator_->LatestCommitted("job", kMem).value(), 5u);
  Reopen();
  EXPECT_EQ(*coordinator_->LatestCommitted("job", kMem).value(), 5u);
  auto commits = coordinator_->ListCommits("job");
  ASSERT_TRUE(commits.ok());
  ASSERT_EQ(commits->size(), 2u);
  EXPECT_EQ((*commits)[0].step(), 3u);
  EXPECT_EQ((*commits)[1].step(), 5u);
  // Voting again for a committed step changes nothing.
  EXPECT_THAT(Vote(5, 0, 1, {kMem}), ElementsAre(kMem));
}

TEST_F(CoordinatorTest, RefusesInconsistentAndInvalidVotes) {
  Vote(1, 0, 2, {kMem});
  auto mismatch = coordinator_->Vote("job", 1, 1, 3, {kMem});
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mismatch.status().message(), HasSubstr("world size 2"));
  EXPECT_THAT(coordinator_->Vote("job", 1, 2, 2, {kMem}).status().message(),
              HasSubstr("outside world size"));
  EXPECT_EQ(coordinator_->Vote("../x", 1, 0, 1, {kMem}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(coordinator_->Vote("job", 1, 0, 2, {proto::TIER_UNSPECIFIED})
                  .status()
                  .message(),
              HasSubstr("invalid tier"));
  EXPECT_FALSE(coordinator_->LatestCommitted("job", kMem)->has_value());
}

TEST_F(CoordinatorTest, ForgetStepNeverDropsTheLatest) {
  Vote(1, 0, 1, {kMem, kDisk});
  Vote(2, 0, 1, {kMem});
  absl::Status s = coordinator_->ForgetStep("job", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition)
      << "latest at local_disk";
  EXPECT_THAT(s.message(), HasSubstr("local_disk"));
  Vote(2, 0, 1, {kDisk});
  ASSERT_TRUE(coordinator_->ForgetStep("job", 1).ok());
  EXPECT_FALSE(coordinator_->GetCommit("job", 1, kMem)->has_value());
  EXPECT_EQ(coordinator_->ForgetStep("job", 2).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A rank resuming from a step finds every newer vote of its own, whichever
// node cast it; withdrawing one takes its parity holder record along, and a
// committed step's vote stays.
TEST_F(CoordinatorTest, StepsVotedByARankAndWithdrawingTheirVotes) {
  Vote(4, 0, 2, {kMem});
  Vote(5, 1, 2, {kMem});
  Vote(6, 0, 2, {kMem, kDisk});
  Vote(6, 1, 2, {kMem});  // step 6 committed at memory
  Vote(7, 1, 2, {kDisk});
  Vote(9, 1, 2, {kMem});
  proto::ShardHolder h;
  h.set_rank(1);
  h.set_node("gone");
  ASSERT_TRUE(coordinator_->PublishShardHolder("job", 7, h).ok());
  absl::StatusOr<std::set<uint64_t>> newer =
      coordinator_->StepsVotedBy("job", 1, 5);
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_THAT(*newer, ElementsAre(6, 7, 9));
  EXPECT_THAT(*coordinator_->StepsVotedBy("job", 0, 0), ElementsAre(4, 6));
  EXPECT_THAT(*coordinator_->StepsVotedBy("other", 1, 0), IsEmpty());
  EXPECT_EQ(coordinator_->StepsVotedBy("bad/job", 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(coordinator_->WithdrawVote("job", 6, 1).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(coordinator_->WithdrawVote("job", 7, 1).ok());
  EXPECT_TRUE(coordinator_->ListShardHolders("job", 7)->empty());
  EXPECT_THAT(*coordinator_->StepsVotedBy("job", 1, 5), ElementsAre(6, 9));
  // Rank 0's vote for step 7 alone then does not commit it.
  EXPECT_THAT(Vote(7, 0, 2, {kDisk}), IsEmpty());
}

TEST_F(CoordinatorTest, ParityRecordsKeepTheFirstPlanAndGoWithTheStep) {
  for (uint32_t rank : {1u, 0u}) {
    proto::ShardHolder h;
    h.set_rank(rank);
    h.set_node(absl::StrCat("node", rank));
    h.set_file_bytes(100 + rank);
    ASSERT_TRUE(coordinator_->PublishShardHolder("job", 5, h).ok());
  }
  absl::StatusOr<std::vector<proto::ShardHolder>> holders =
      coordinator_->ListShardHolders("job", 5);
  ASSERT_TRUE(holders.ok()) << holders.status();
  ASSERT_EQ(holders->size(), 2u);
  EXPECT_EQ((*holders)[0].node(), "node0");
  EXPECT_EQ((*holders)[1].file_bytes(), 101u);

  EXPECT_FALSE(coordinator_->GetParityPlan("job", 5)->has_value());
  proto::ParityPlan first, second;
  first.set_job("job");
  first.set_step(5);
  first.set_planned_by("node0");
  second = first;
  second.set_planned_by("node1");
  EXPECT_EQ(coordinator_->SettleParityPlan(first)->planned_by(), "node0");
  EXPECT_EQ(coordinator_->SettleParityPlan(second)->planned_by(), "node0");
  Reopen();
  EXPECT_EQ((*coordinator_->GetParityPlan("job", 5))->planned_by(), "node0");

  // The records do not count as votes, and go with their step.
  Vote(5, 0, 1, {kMem});
  Vote(6, 0, 1, {kMem});
  EXPECT_THAT(*coordinator_->StepsVotedAt("job", kMem, 0), ElementsAre(5, 6));
  ASSERT_TRUE(coordinator_->ForgetStep("job", 5).ok());
  EXPECT_FALSE(coordinator_->GetParityPlan("job", 5)->has_value());
  EXPECT_TRUE(coordinator_->ListShardHolders("job", 5)->empty());
}

TEST_F(CoordinatorTest, ConcurrentVotesCommitExactlyOnce) {
  constexpr int kRanks = 16;
  std::vector<std::thread> threads;
  std::atomic<int> saw_commit{0};
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto result = coordinator_->Vote("job", 7, r, kRanks, {kMem});
      ASSERT_TRUE(result.ok());
      if (!result->empty()) ++saw_commit;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(saw_commit.load(), 1)
      << "only the last vote sees the step committed";
  EXPECT_EQ(coordinator_->ListCommits("job")->size(), 1u);
}

// Publication: a topic's versions are numbered from 1 in the order they were
// kept, each record kept as it was, across a reopen; bad topics are refused.
TEST_F(CoordinatorTest, TopicVersionsAreNumberedInOrderAndKept) {
  for (uint64_t step : {10, 20, 30}) {
    proto::VersionRecord v;
    v.set_topic("policy");
    v.set_job("job");
    v.set_step(step);
    auto kept = coordinator_->AddVersion(v);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(kept->version(), step / 10);
  }
  proto::VersionRecord other;
  other.set_topic("critic");
  ASSERT_TRUE(coordinator_->AddVersion(other).ok());
  Reopen();
  auto versions = coordinator_->ListVersions("policy");
  ASSERT_TRUE(versions.ok()) << versions.status();
  ASSERT_EQ(versions->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*versions)[i].version(), i + 1);
    EXPECT_EQ((*versions)[i].step(), 10 * (i + 1));
  }
  auto topics = coordinator_->ListTopics();
  ASSERT_TRUE(topics.ok()) << topics.status();
  EXPECT_EQ(*topics, (std::vector<std::string>{"critic", "policy"}));
  EXPECT_TRUE(coordinator_->ListVersions("none")->empty());
  proto::VersionRecord bad;
  bad.set_topic("a/b");
  absl::Status refused = coordinator_->AddVersion(bad).status();
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("topic \"a/b\""));
}

// A topic published for long keeps the newest kVersionRecordsKept records
// in the coordinator, not every one ever made; numbering goes on after them.
TEST_F(CoordinatorTest, OnlyTheNewestVersionRecordsAreKept) {
  const uint64_t made = Coordinator::kVersionRecordsKept + 8;
  proto::VersionRecord v;
  v.set_topic("policy");
  for (uint64_t i = 1; i <= made; ++i) {
    auto kept = coordinator_->AddVersion(v);
    ASSERT_TRUE(kept.ok()) << kept.status();
    ASSERT_EQ(kept->version(), i);
  }
  auto versions = coordinator_->ListVersions("policy");
  ASSERT_TRUE(versions.ok()) << versions.status();
  ASSERT_EQ(versions->size(), Coordinator::kVersionRecordsKept);
  EXPECT_EQ(versions->front().version(), made - versions->size() + 1);
  EXPECT_EQ(versions->back().version(), made);
  auto newest = coordinator_->NewestVersion("policy");
  ASSERT_TRUE(newest.ok() && newest->has_value());
  EXPECT_EQ((*newest)->version(), made);
  Reopen();
  auto next = coordinator_->AddVersion(v);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version(), made + 1);
  EXPECT_EQ(coordinator_->ListVersions("policy")->size(),
            Coordinator::kVersionRecordsKept);
}

}  // namespace
}  // namespace ckpt::daemon
