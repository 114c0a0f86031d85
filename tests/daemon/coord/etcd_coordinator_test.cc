// The etcd coordination backend against a real etcd on loopback: commits need
// every rank's vote and happen once however nodes race, the latest step never
// goes backward, a node without its lease is fenced and rejoins, and a commit
// survives etcd being killed and restarted.
#include "daemon/coord/etcd_coordinator.h"

#include <algorithm>
#include <set>
#include <thread>

#include "daemon/health/node_watch.h"
#include "daemon/service/checkpoint_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/daemon/etcd_process.h"
#include "tests/daemon/service_util.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr proto::Tier kMem = proto::TIER_MEMORY;
constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;

class EtcdCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(etcd_.Start())
        << "etcd (Debian's etcd-server, installed by tools/setup.sh) did not "
           "start:\n"
        << etcd_.log();
  }
  std::unique_ptr<EtcdCoordinator> Node(const std::string& id,
                                        absl::Duration ttl = absl::Seconds(5)) {
    auto c = EtcdCoordinator::Connect({.endpoints = {etcd_.endpoint()},
                                       .node_id = id,
                                       .lease_ttl = ttl,
                                       .ca_file = etcd_.ca_file(),
                                       .user = etcd_.user(),
                                       .password_file = etcd_.password_file()});
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  // Waits until `watcher` no longer sees `node` alive (its lease expired).
  static bool Expired(EtcdCoordinator* watcher, const std::string& node) {
    for (int i = 0; i < 200; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      auto live = watcher->LiveNodes();
      EXPECT_TRUE(live.ok()) << live.status();
      if (live.ok() &&
          std::find(live->begin(), live->end(), node) == live->end()) {
        return true;
      }
    }
    return false;
  }
  testing::EtcdProcess etcd_;
};

TEST_F(EtcdCoordinatorTest, CommitsOnlyWhenEveryRankOfTheWorldVoted) {
  auto a = Node("node-a"), b = Node("node-b");
  ASSERT_TRUE(a && b);
  // World of 4: ranks 0-1 on node a, 2-3 on node b.
  EXPECT_THAT(*a->Vote("job", 7, 0, 4, {kMem, kDisk}), ElementsAre());
  EXPECT_THAT(*a->Vote("job", 7, 1, 4, {kMem}), ElementsAre());
  EXPECT_THAT(*b->Vote("job", 7, 2, 4, {kMem, kDisk}), ElementsAre());
  EXPECT_FALSE(a->GetCommit("job", 7, kMem)->has_value());
  EXPECT_THAT(*b->Vote("job", 7, 3, 4, {kMem}), ElementsAre(kMem));
  for (auto* c : {a.get(), b.get()}) {
    auto commit = c->GetCommit("job", 7, kMem);
    ASSERT_TRUE(commit.ok() && commit->has_value());
    EXPECT_EQ((*commit)->world_size(), 4u);
    EXPECT_EQ(**c->LatestCommitted("job", kMem), 7u);
    EXPECT_FALSE(c->LatestCommitted("job", kDisk)->has_value());
  }
  // Votes merge: rank 1 and 3 reach the disk later.
  EXPECT_THAT(*a->Vote("job", 7, 1, 4, {kDisk}), ElementsAre(kMem));
  EXPECT_THAT(*b->Vote("job", 7, 3, 4, {kDisk}), ElementsAre(kMem, kDisk));
  EXPECT_EQ(a->ListCommits("job")->size(), 2u);
  // A vote with another world size for the same step is refused.
  auto bad = a->Vote("job", 7, 0, 8, {kMem});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->Vote("job", 7, 4, 4, {kMem}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EtcdCoordinatorTest, StepsVotedAtATierAfterAStep) {
  auto a = Node("node-a"), b = Node("node-b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Vote("job", 3, 0, 2, {kMem, proto::TIER_PEER}).ok());
  ASSERT_TRUE(b->Vote("job", 5, 1, 2, {kMem}).ok());
  ASSERT_TRUE(b->Vote("job", 7, 1, 2, {proto::TIER_PEER}).ok());
  ASSERT_TRUE(a->Vote("job", 12, 0, 2, {proto::TIER_PEER}).ok());
  ASSERT_TRUE(a->Vote("other", 9, 0, 2, {proto::TIER_PEER}).ok());
  auto all = b->StepsVotedAt("job", proto::TIER_PEER, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre(3, 7, 12));
  EXPECT_THAT(*a->StepsVotedAt("job", proto::TIER_PEER, 7), ElementsAre(12));
  EXPECT_THAT(*a->StepsVotedAt("job", kMem, 3), ElementsAre(5));
}

// Votes a node cast before it lost everything are found by any node through
// the rank, and withdrawn with their holder records.
TEST_F(EtcdCoordinatorTest, StepsVotedByARankWhicheverNodeCastThem) {
  auto a = Node("node-a"), b = Node("node-b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Vote("job", 8, 1, 2, {kMem, kDisk}).ok());
  ASSERT_TRUE(a->Vote("job", 9, 1, 2, {kMem}).ok());
  ASSERT_TRUE(b->Vote("job", 9, 0, 2, {kMem}).ok());  // 9 committed
  proto::ShardHolder h;
  h.set_rank(1);
  h.set_node("node-a");
  ASSERT_TRUE(a->PublishShardHolder("job", 8, h).ok());
  a.reset();  // node-a is gone with its memory of those votes
  absl::StatusOr<std::set<uint64_t>> newer = b->StepsVotedBy("job", 1, 7);
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_THAT(*newer, ElementsAre(8, 9));
  ASSERT_TRUE(b->WithdrawVote("job", 8, 1).ok());
  EXPECT_EQ(b->WithdrawVote("job", 9, 1).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(*b->StepsVotedBy("job", 1, 7), ElementsAre(9));
  EXPECT_TRUE(b->ListShardHolders("job", 8)->empty());
  // Rank 0 voting step 8 alone does not commit it.
  EXPECT_THAT(*b->Vote("job", 8, 0, 2, {kMem, kDisk}), ElementsAre());
}

TEST_F(EtcdCoordinatorTest, TheLatestStepNeverGoesBackward) {
  auto a = Node("node-a");
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->Vote("job", 5, 0, 1, {kMem}).ok());
  ASSERT_TRUE(a->Vote("job", 3, 0, 1, {kMem}).ok());  // late, older step
  EXPECT_EQ(**a->LatestCommitted("job", kMem), 5u);
  EXPECT_TRUE(a->GetCommit("job", 3, kMem)->has_value());
  // The latest is never forgotten; an older step is.
  EXPECT_EQ(a->ForgetStep("job", 5).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(a->ForgetStep("job", 3).ok());
  EXPECT_FALSE(a->GetCommit("job", 3, kMem)->has_value());
  // A committed step's vote is not withdrawn.
  EXPECT_EQ(a->WithdrawVote("job", 5, 0).code(),
            absl::StatusCode::kAlreadyExists);
}

// Votes in batches (more ranks than one transaction takes) count as votes one
// at a time do; a withdrawn vote no longer counts.
TEST_F(EtcdCoordinatorTest, VotesInBatchesCountRankByRank) {
  auto a = Node("node-a"), b = Node("node-b");
  ASSERT_TRUE(a && b);
  auto ranks = [](uint32_t from, uint32_t to) {
    std::vector<uint32_t> r;
    for (uint32_t i = from; i < to; ++i) r.push_back(i);
    return r;
  };
  EXPECT_THAT(*a->VoteMany("job", 3, ranks(0, 20), 40, {kMem, kDisk}),
              ElementsAre());
  EXPECT_THAT(*b->VoteMany("job", 3, ranks(20, 39), 40, {kMem}), ElementsAre());
  ASSERT_TRUE(b->WithdrawVote("job", 3, 38).ok());
  EXPECT_THAT(*b->VoteMany("job", 3, {39}, 40, {kMem}), ElementsAre());
  EXPECT_FALSE(a->GetCommit("job", 3, kMem)->has_value());
  EXPECT_THAT(*b->VoteMany("job", 3, {38, 38}, 40, {kMem}), ElementsAre(kMem));
  EXPECT_EQ(**a->LatestCommitted("job", kMem), 3u);
  // The disk: ranks 20..39 reach it later, one batch.
  EXPECT_THAT(*b->VoteMany("job", 3, ranks(20, 40), 40, {kDisk}),
              ElementsAre(kMem, kDisk));
  // Another world size in a batch is refused, naming the rank that differs.
  auto bad = a->VoteMany("job", 3, {0, 1}, 41, {kMem});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(bad.status().message(), HasSubstr("world size 40"));
}

TEST_F(EtcdCoordinatorTest, RacingNodesCommitEachStepExactlyOnce) {
  constexpr int kNodes = 4, kRanksPerNode = 4, kSteps = 6;
  std::vector<std::unique_ptr<EtcdCoordinator>> nodes;
  for (int n = 0; n < kNodes; ++n)
    nodes.push_back(Node("n" + std::to_string(n)));
  std::vector<std::thread> voters;
  std::vector<int> commits_seen(kNodes, 0);
  for (int n = 0; n < kNodes; ++n) {
    voters.emplace_back([&, n] {
      for (uint64_t step = 1; step <= kSteps; ++step) {
        for (int r = 0; r < kRanksPerNode; ++r) {
          auto done = nodes[n]->Vote("race", step, n * kRanksPerNode + r,
                                     kNodes * kRanksPerNode, {kMem});
          ASSERT_TRUE(done.ok()) << done.status();
          if (!done->empty()) commits_seen[n]++;
        }
      }
    });
  }
  for (auto& t : voters) t.join();
  auto commits = nodes[0]->ListCommits("race");
  ASSERT_TRUE(commits.ok());
  EXPECT_EQ(commits->size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(**nodes[1]->LatestCommitted("race", kMem),
            static_cast<uint64_t>(kSteps));
  // The record is written once: later votes do not rewrite it.
  auto first = *nodes[2]->GetCommit("race", 1, kMem);
  ASSERT_TRUE(
      nodes[3]->Vote("race", 1, 0, kNodes * kRanksPerNode, {kMem}).ok());
  EXPECT_EQ((*nodes[2]->GetCommit("race", 1, kMem))->committed_unix_micros(),
            first->committed_unix_micros());
}

TEST_F(EtcdCoordinatorTest, ANodePausedPastItsLeaseIsFencedThenRejoins) {
  auto a = Node("node-a", absl::Seconds(1)), b = Node("node-b");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Vote("job", 1, 0, 2, {kMem}).ok());
  ASSERT_TRUE(b->Vote("job", 1, 1, 2, {kMem}).ok());
  ASSERT_TRUE(a->Vote("job", 2, 0, 2, {kMem}).ok());
  const int64_t lease = a->lease_id();
  // Paused: no keep-alive until etcd has expired the lease (TTL 1 s).
  a->PauseKeepAliveForTesting(true);
  ASSERT_TRUE(Expired(b.get(), "node-a"))
      << "etcd never expired the paused node's lease";
  // Its vote would complete step 2 at the disk tier: refused, no commit; nor
  // may it collect garbage.
  ASSERT_TRUE(b->Vote("job", 2, 1, 2, {kMem, kDisk}).ok());
  auto fenced = a->Vote("job", 2, 0, 2, {kDisk});
  ASSERT_FALSE(fenced.ok());
  EXPECT_EQ(fenced.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fenced.status().message(), HasSubstr("fenced"));
  EXPECT_FALSE(b->GetCommit("job", 2, kDisk)->has_value());
  EXPECT_EQ(a->ForgetStep("job", 1).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(b->GetCommit("job", 1, kMem)->has_value());
  // Resumed: the keep-alive loop finds the lease gone, takes a new one and
  // registers again; then the node votes and commits normally.
  a->PauseKeepAliveForTesting(false);
  for (int i = 0; i < 200 && a->rejoins() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_EQ(a->rejoins(), 1);
  EXPECT_NE(a->lease_id(), lease);
  EXPECT_THAT(*a->Vote("job", 2, 0, 2, {kDisk}), ElementsAre(kMem, kDisk));
  EXPECT_TRUE(a->ForgetStep("job", 1).ok());
}

// Membership changes name the jobs a node served; a departure is claimed
// once, and a node that stops claims its own.
TEST_F(EtcdCoordinatorTest,
       MemberChangesNameTheJobsAndADepartureIsClaimedOnce) {
  auto a = Node("node-a", absl::Seconds(1)), b = Node("node-b"),
       c = Node("node-c");
  ASSERT_TRUE(a && b && c);
  // A name that is no job id is refused before it reaches etcd.
  const absl::Status bad = a->SetServedJobs({"train", "../etc\nx"});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  ASSERT_TRUE(a->SetServedJobs({"train"}).ok());
  int64_t revision = 0;
  ASSERT_TRUE(b->WatchMemberChanges(&revision, absl::Milliseconds(10)).ok());
  const int64_t lease = a->lease_id();
  a->PauseKeepAliveForTesting(true);
  // Waits (up to 20 s) for a change of node-a that `joined` or not.
  auto await = [&](bool joined) -> std::optional<Coordinator::MemberChange> {
    for (int i = 0; i < 100; ++i) {
      auto changes = b->WatchMemberChanges(&revision, absl::Milliseconds(200));
      EXPECT_TRUE(changes.ok()) << changes.status();
      if (!changes.ok()) return std::nullopt;
      for (const Coordinator::MemberChange& ch : *changes) {
        if (ch.node == "node-a" && ch.joined == joined) return ch;
      }
    }
    return std::nullopt;
  };
  std::optional<Coordinator::MemberChange> left = await(false);
  ASSERT_TRUE(left.has_value()) << "node-a's lease never expired";
  EXPECT_EQ(left->lease, lease);
  EXPECT_THAT(left->jobs, ElementsAre("train"));
  EXPECT_TRUE(*b->ClaimDeparture("node-a", lease, "node-b"));
  EXPECT_FALSE(*c->ClaimDeparture("node-a", lease, "node-c"));
  // Resumed: it joins again under a new lease, serving the same jobs.
  a->PauseKeepAliveForTesting(false);
  std::optional<Coordinator::MemberChange> back = await(true);
  ASSERT_TRUE(back.has_value()) << "node-a never rejoined";
  EXPECT_NE(back->lease, lease);
  EXPECT_THAT(back->jobs, ElementsAre("train"));
  // A node that stops claims its own departure first.
  auto d = Node("node-d");
  ASSERT_TRUE(d);
  const int64_t d_lease = d->lease_id();
  d.reset();
  EXPECT_FALSE(*b->ClaimDeparture("node-d", d_lease, "node-b"));
  // Started again, it drops the claims of its earlier departures.
  d = Node("node-d");
  ASSERT_TRUE(d);
  EXPECT_TRUE(*b->ClaimDeparture("node-d", d_lease, "node-b"));
}

// NodeWatch on three nodes: one paused past its lease while it serves a job
// is one node_lost failure of the job in the whole cluster, healed when it
// rejoins; one that stops cleanly is none.
TEST_F(EtcdCoordinatorTest, ANodeLostIsCountedOnceAndHealsWhenItIsBack) {
  auto a = Node("node-a", absl::Seconds(1)), b = Node("node-b"),
       c = Node("node-c"), d = Node("node-d");
  ASSERT_TRUE(a && b && c && d);
  Metrics ma, mb, mc, md;
  FailureLog fa(&ma), fb(&mb), fc(&mc), fd(&md);
  std::atomic<int> a_rounds{0}, d_rounds{0};
  auto watch = [](EtcdCoordinator* node, FailureLog* log,
                  std::vector<std::string> jobs, std::atomic<int>* rounds) {
    return std::make_unique<NodeWatch>(node, node->MemberKey().substr(12), log,
                                       [jobs, rounds] {
                                         if (rounds != nullptr) ++*rounds;
                                         return jobs;
                                       });
  };
  auto wa = watch(a.get(), &fa, {"train"}, &a_rounds);
  auto wb = watch(b.get(), &fb, {"train"}, nullptr);
  auto wc = watch(c.get(), &fc, {}, nullptr);
  auto wd = watch(d.get(), &fd, {"other"}, &d_rounds);
  // A second round began: the first one's jobs were kept.
  for (int i = 0; i < 400 && (a_rounds < 2 || d_rounds < 2); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_GE(a_rounds.load(), 2);
  ASSERT_GE(d_rounds.load(), 2);
  // node-d stops cleanly: no failure.
  wd.reset();
  d.reset();
  auto lost = [&] {
    std::vector<proto::FailureRecord> all = fb.Timeline("");
    for (const auto& r : fc.Timeline("")) all.push_back(r);
    return all;
  };
  a->PauseKeepAliveForTesting(true);
  for (int i = 0; i < 400 && lost().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(lost().size(), 1u) << "node-a's loss was not counted";
  const proto::FailureRecord r = lost()[0];
  EXPECT_EQ(r.job(), "train");
  EXPECT_EQ(r.cause(), "node_lost");
  EXPECT_EQ(r.node(), "node-a");
  EXPECT_THAT(r.detail(), HasSubstr("node node-a's etcd lease expired"));
  EXPECT_TRUE(fa.Timeline("").empty()) << "not by the node itself";
  a->PauseKeepAliveForTesting(false);
  auto recovered = [&] {
    std::vector<proto::FailureRecord> now = lost();
    return now.size() == 1 && now[0].recovered_unix_micros() != 0;
  };
  for (int i = 0; i < 400 && !recovered(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(recovered()) << "healed once node-a rejoined";
  EXPECT_GE(lost()[0].recovered_unix_micros(), r.unix_micros());
  // Still one: neither the rejoin nor node-d's stop counted again.
  EXPECT_EQ(lost().size(), 1u);
}

// A daemon that persisted shards while fenced (its votes refused) votes for
// them again once it has rejoined: the step commits then.
TEST_F(EtcdCoordinatorTest, ShardsPersistedWhileFencedCommitAfterTheRejoin) {
  std::shared_ptr<EtcdCoordinator> etcd = Node("node-a", absl::Seconds(1));
  auto b = Node("node-b");
  ASSERT_TRUE(etcd && b);
  testing::TempDir dir;
  ServiceOptions o = testing::TestServiceOptions(dir);
  o.coordinator = etcd;
  auto service = CheckpointService::Start(io::DefaultFileSystem(), o);
  ASSERT_TRUE(service.ok()) << service.status();
  etcd->PauseKeepAliveForTesting(true);
  ASSERT_TRUE(Expired(b.get(), "node-a"));
  // Staged and persisted while fenced: both votes are refused.
  const testing::RankState one(1, 0);
  ASSERT_TRUE(one.Stage(service->get(), "f", 1, 0, 1).ok());
  (*service)->WaitIdle();
  auto shard = (*service)->GetShard("f", 1, 0);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->state(), proto::SHARD_PERSISTED) << shard->error();
  EXPECT_FALSE(b->GetCommit("f", 1, kDisk)->has_value());
  // Rejoined, the next save's persist votes again for step 1 too.
  etcd->PauseKeepAliveForTesting(false);
  for (int i = 0; i < 200 && etcd->rejoins() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_EQ(etcd->rejoins(), 1);
  ASSERT_TRUE(
      testing::RankState(2, 0).Stage(service->get(), "f", 2, 0, 1).ok());
  for (uint64_t step : {1, 2}) {
    auto commit =
        (*service)->WaitCommitted("f", step, kDisk, absl::Seconds(30));
    EXPECT_TRUE(commit.ok()) << "step " << step << ": " << commit.status();
  }
  EXPECT_TRUE(b->GetCommit("f", 1, kMem)->has_value());
}

TEST_F(EtcdCoordinatorTest, ACommitSurvivesEtcdKilledAndRestarted) {
  auto a = Node("node-a");
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->Vote("job", 1, 0, 1, {kMem, kDisk}).ok());
  const int64_t first =
      (*a->GetCommit("job", 1, kDisk))->committed_unix_micros();
  etcd_.Kill();
  auto down = a->Vote("job", 2, 0, 1, {kMem});
  EXPECT_FALSE(down.ok());
  EXPECT_THAT(down.status().message(), HasSubstr("etcd"));
  ASSERT_TRUE(etcd_.Start()) << etcd_.log();
  // The same vote again, once etcd is back: committed exactly once, and the
  // earlier commit is untouched.
  absl::StatusOr<std::vector<proto::Tier>> again;
  for (int i = 0; i < 100; ++i) {
    again = a->Vote("job", 2, 0, 1, {kMem});
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(*again, ElementsAre(kMem));
  EXPECT_EQ((*a->GetCommit("job", 1, kDisk))->committed_unix_micros(), first);
  EXPECT_EQ(**a->LatestCommitted("job", kMem), 2u);
  EXPECT_EQ(a->ListCommits("job")->size(), 3u);
}

TEST_F(EtcdCoordinatorTest, RollBackIsTheOnlyWayTheLatestGoesBack) {
  auto a = Node("node-a");
  ASSERT_TRUE(a);
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(a->Vote("job", step, 0, 1, {kMem, kDisk}).ok());
  }
  proto::RollbackRecord record;
  record.set_job("job");
  record.set_from_step(3);
  record.set_to_step(1);
  record.set_unix_micros(42);
  ASSERT_TRUE(a->RollBack("job", 1, record).ok());
  EXPECT_EQ(**a->LatestCommitted("job", kMem), 1u);
  EXPECT_EQ(**a->LatestCommitted("job", kDisk), 1u);
  EXPECT_EQ(a->ListCommits("job")->size(), 2u) << "step 1 at two tiers";
  EXPECT_FALSE(a->GetCommit("job", 3, kDisk)->has_value());
  // The job goes on: step 2 commits anew.
  EXPECT_THAT(*a->Vote("job", 2, 0, 1, {kMem}), ElementsAre(kMem));
  EXPECT_EQ(**a->LatestCommitted("job", kMem), 2u);
}

TEST_F(EtcdCoordinatorTest, RacingNodesSettleOneParityPlan) {
  auto a = Node("a");
  auto b = Node("b");
  ASSERT_TRUE(a && b);
  proto::ShardHolder h;
  h.set_rank(0);
  h.set_node("a");
  ASSERT_TRUE(a->PublishShardHolder("job", 3, h).ok());
  h.set_rank(1);
  h.set_node("b");
  ASSERT_TRUE(b->PublishShardHolder("job", 3, h).ok());
  ASSERT_EQ(a->ListShardHolders("job", 3)->size(), 2u);

  std::vector<std::string> kept(2);
  std::thread ta([&] {
    proto::ParityPlan p;
    p.set_job("job");
    p.set_step(3);
    p.set_planned_by("a");
    auto r = a->SettleParityPlan(p);
    kept[0] = r.ok() ? r->planned_by() : r.status().ToString();
  });
  std::thread tb([&] {
    proto::ParityPlan p;
    p.set_job("job");
    p.set_step(3);
    p.set_planned_by("b");
    auto r = b->SettleParityPlan(p);
    kept[1] = r.ok() ? r->planned_by() : r.status().ToString();
  });
  ta.join();
  tb.join();
  EXPECT_EQ(kept[0], kept[1]);
  EXPECT_TRUE(kept[0] == "a" || kept[0] == "b") << kept[0];
  EXPECT_EQ((*b->GetParityPlan("job", 3))->planned_by(), kept[0]);
  // Peers are listed in one read, with their records.
  proto::PeerInfo info;
  info.set_node_id("a");
  info.set_address("127.0.0.1:1");
  ASSERT_TRUE(a->PublishPeer(info).ok());
  auto peers = b->ListPeers();
  ASSERT_TRUE(peers.ok()) << peers.status();
  ASSERT_EQ(peers->size(), 1u);
  EXPECT_EQ((*peers)[0].address(), "127.0.0.1:1");
}

TEST(EtcdUrlTest, ParsesEndpointsAndNamesWhatIsWrong) {
  EXPECT_THAT(*ParseEtcdUrl("etcd://10.0.0.1:2379,10.0.0.2:2379"),
              ElementsAre("10.0.0.1:2379", "10.0.0.2:2379"));
  EXPECT_THAT(ParseEtcdUrl("http://x:1").status().message(),
              HasSubstr("etcd://host:port"));
  EXPECT_THAT(ParseEtcdUrl("etcd://host").status().message(),
              HasSubstr("\"host\" is not host:port"));
  EXPECT_FALSE(ParseEtcdUrl("etcd://").ok());
}

// Two nodes publishing at once: every version is numbered once, 1 to 20.
TEST_F(EtcdCoordinatorTest, RacingPublishersNumberEveryVersionOnce) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  ASSERT_TRUE(a && b);
  auto publish = [](EtcdCoordinator* node) {
    for (int i = 0; i < 10; ++i) {
      proto::VersionRecord v;
      v.set_topic("policy");
      v.set_source_node(node->MemberKey());
      EXPECT_TRUE(node->AddVersion(v).ok());
    }
  };
  std::thread ta(publish, a.get());
  std::thread tb(publish, b.get());
  ta.join();
  tb.join();
  auto versions = a->ListVersions("policy");
  ASSERT_TRUE(versions.ok()) << versions.status();
  ASSERT_EQ(versions->size(), 20u);
  for (size_t i = 0; i < versions->size(); ++i) {
    EXPECT_EQ((*versions)[i].version(), i + 1);
  }
}

// A subscriber's wait for the next version ends when another node makes it
// (a watch), not at its timeout; a version already there ends it at once.
TEST_F(EtcdCoordinatorTest, AWaitForTheNextVersionEndsWhenItIsMade) {
  auto a = Node("node-a");
  auto b = Node("node-b");
  ASSERT_TRUE(a && b);
  proto::VersionRecord v;
  v.set_topic("policy");
  ASSERT_TRUE(a->AddVersion(v).ok());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(b->WaitForVersionAfter("policy", 0, absl::Minutes(2)).ok());
  EXPECT_LT(absl::Now() - start, absl::Minutes(1));
  absl::Status waited = absl::UnknownError("not returned");
  absl::Time returned;
  std::thread waiter([&] {
    waited = b->WaitForVersionAfter("policy", 1, absl::Minutes(2));
    returned = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time made = absl::Now();
  auto second = a->AddVersion(v);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->version(), 2u);
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
  // Ended by the version, not by its two minutes.
  EXPECT_LT(returned - made, absl::Minutes(1));
  // Nothing newer: the wait lasts its timeout.
  EXPECT_TRUE(
      b->WaitForVersionAfter("policy", 2, absl::Milliseconds(200)).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      b->WaitForVersionAfter("a/b", 0, absl::Seconds(1))));
}

}  // namespace
}  // namespace ckpt::daemon
