// Parity plans: every rank in exactly one group, a group's blocks on distinct
// nodes (so m lost nodes lose at most m blocks of it), failure domains and
// parity memory spread, the same plan from any node, and clear refusals.
#include "daemon/peer/parity_plan.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

struct Cluster {
  std::vector<proto::PeerInfo> nodes;
  std::vector<proto::ShardHolder> holders;
};

// `nodes` nodes, node i in domain i % domains, ranks_per_node ranks each
// (rank r on node r / ranks_per_node), shard r of 1000 + r bytes.
Cluster MakeCluster(int nodes, int domains, int ranks_per_node) {
  Cluster c;
  for (int i = 0; i < nodes; ++i) {
    proto::PeerInfo p;
    p.set_node_id("node" + std::to_string(i));
    p.set_failure_domain("rack" + std::to_string(i % domains));
    c.nodes.push_back(p);
    for (int l = 0; l < ranks_per_node; ++l) {
      proto::ShardHolder h;
      h.set_rank(i * ranks_per_node + l);
      h.set_node(p.node_id());
      h.set_failure_domain(p.failure_domain());
      h.set_file_bytes(1000 + h.rank());
      c.holders.push_back(h);
    }
  }
  return c;
}

// The invariants every plan keeps; returns parity bytes per node.
std::map<std::string, uint64_t> CheckPlan(const proto::ParityPlan& plan,
                                          const Cluster& c, int k, int m) {
  std::set<uint32_t> ranks;
  std::map<std::string, uint64_t> parity_on;
  for (const proto::ParityGroup& g : plan.groups()) {
    EXPECT_GE(g.data_size(), 1);
    EXPECT_LE(g.data_size(), k);
    EXPECT_EQ(g.parity_nodes_size(), m);
    std::set<std::string> nodes;
    uint64_t stripe = 0;
    for (const proto::ShardHolder& d : g.data()) {
      EXPECT_TRUE(ranks.insert(d.rank()).second) << "rank " << d.rank();
      EXPECT_TRUE(nodes.insert(d.node()).second)
          << "group " << g.group() << " has two blocks on " << d.node();
      stripe = std::max(stripe, d.file_bytes());
    }
    for (const std::string& p : g.parity_nodes()) {
      EXPECT_TRUE(nodes.insert(p).second)
          << "group " << g.group() << " puts parity on " << p
          << ", which holds another of its blocks";
      parity_on[p] += g.stripe_bytes();
    }
    EXPECT_EQ(g.stripe_bytes(), stripe);
  }
  EXPECT_EQ(ranks.size(), c.holders.size());
  return parity_on;
}

TEST(ParityPlanTest, SixNodesRs42MakeAFullAndAShortGroup) {
  Cluster c = MakeCluster(6, 6, 1);
  absl::StatusOr<proto::ParityPlan> plan =
      PlanParity("job", 7, 4, 2, 6, c.holders, c.nodes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(*plan, c, 4, 2);
  ASSERT_EQ(plan->groups_size(), 2);
  EXPECT_EQ(plan->groups(0).data_size(), 4);
  EXPECT_EQ(plan->groups(1).data_size(), 2);
  // Against two full replicas of every shard, the parity is a third.
  uint64_t shards = 0;
  for (const auto& h : c.holders) shards += h.file_bytes();
  EXPECT_LT(static_cast<double>(ParityBytes(*plan)) / (2 * shards), 0.4);
  absl::StatusOr<ParityPosition> at = FindInPlan(*plan, 5);
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(at->group->data(at->index).rank(), 5u);
  EXPECT_THAT(FindInPlan(*plan, 6).status().message(),
              HasSubstr("job job step 7 has no rank 6"));
}

TEST(ParityPlanTest, ManyRanksPerNodeSpreadOverDomainsAndParityEvenly) {
  for (auto [nodes, domains, per_node, k, m] :
       std::vector<std::tuple<int, int, int, int, int>>{{8, 4, 8, 4, 2},
                                                        {6, 3, 2, 4, 2},
                                                        {12, 12, 1, 6, 2},
                                                        {16, 2, 8, 8, 3}}) {
    SCOPED_TRACE(::testing::Message()
                 << nodes << " nodes in " << domains << " domains, " << per_node
                 << " ranks each, rs:" << k << "+" << m);
    Cluster c = MakeCluster(nodes, domains, per_node);
    absl::StatusOr<proto::ParityPlan> plan =
        PlanParity("job", 1, k, m, nodes * per_node, c.holders, c.nodes);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::map<std::string, uint64_t> parity_on = CheckPlan(*plan, c, k, m);
    // Full groups while every node has shards left.
    EXPECT_EQ(plan->groups_size(), (nodes * per_node + k - 1) / k);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& node : c.nodes) {
      lo = std::min(lo, parity_on[node.node_id()]);
      hi = std::max(hi, parity_on[node.node_id()]);
    }
    // No node holds more than two stripes above the least loaded.
    EXPECT_LE(hi - lo, 2 * (1000u + nodes * per_node)) << lo << " " << hi;
    // Data blocks of a group come from distinct domains when there are
    // enough of them.
    for (const proto::ParityGroup& g : plan->groups()) {
      std::set<std::string> seen;
      for (const auto& d : g.data()) seen.insert(d.failure_domain());
      EXPECT_EQ(seen.size(),
                std::min<size_t>(g.data_size(), static_cast<size_t>(domains)));
    }
  }
}

TEST(ParityPlanTest, AnyNodeMakesTheSamePlan) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  Cluster c = MakeCluster(9, 3, 4);
  absl::StatusOr<proto::ParityPlan> first =
      PlanParity("job", 3, 4, 2, 36, c.holders, c.nodes);
  ASSERT_TRUE(first.ok());
  for (int i = 0; i < 5; ++i) {
    std::shuffle(c.holders.begin(), c.holders.end(), rng);
    std::shuffle(c.nodes.begin(), c.nodes.end(), rng);
    absl::StatusOr<proto::ParityPlan> again =
        PlanParity("job", 3, 4, 2, 36, c.holders, c.nodes);
    ASSERT_TRUE(again.ok());
    again->set_planned_unix_micros(first->planned_unix_micros());
    EXPECT_TRUE(
        google::protobuf::util::MessageDifferencer::Equals(*first, *again));
  }
}

TEST(ParityPlanTest, FewNodesMakeSmallerGroupsOrAreRefused) {
  // Three nodes for rs:4+2: groups of one data block and two parity blocks.
  Cluster c = MakeCluster(3, 3, 2);
  absl::StatusOr<proto::ParityPlan> plan =
      PlanParity("job", 1, 4, 2, 6, c.holders, c.nodes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckPlan(*plan, c, 4, 2);
  EXPECT_EQ(plan->groups_size(), 6);
  // Live nodes that hold no shard still take parity.
  Cluster two = MakeCluster(2, 2, 1);
  proto::PeerInfo spare;
  spare.set_node_id("spare");
  two.nodes.push_back(spare);
  plan = PlanParity("job", 1, 4, 2, 2, two.holders, two.nodes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->groups_size(), 2);
  two.nodes.pop_back();
  EXPECT_THAT(
      PlanParity("job", 1, 4, 2, 2, two.holders, two.nodes).status().message(),
      HasSubstr("rs:4+2 needs at least 3 live nodes (one data block and 2 "
                "parity blocks per group); 2 are live"));
}

TEST(ParityPlanTest, MissingOrDoubledRanksAreNamed) {
  Cluster c = MakeCluster(4, 2, 2);
  std::vector<proto::ShardHolder> holders = c.holders;
  holders.erase(holders.begin() + 3);
  EXPECT_THAT(
      PlanParity("job", 9, 2, 1, 8, holders, c.nodes).status().message(),
      HasSubstr("parity plan of job job step 9: rank 3 has no holder"));
  holders = c.holders;
  holders[5].set_rank(4);
  EXPECT_THAT(
      PlanParity("job", 9, 2, 1, 8, holders, c.nodes).status().message(),
      HasSubstr("rank 4 has two holders (node2 and node2)"));
  EXPECT_THAT(
      PlanParity("job", 9, 2, 1, 7, c.holders, c.nodes).status().message(),
      HasSubstr("rank 7 is outside world size 7"));
}

TEST(ParityPlanTest,
     LostParityHoldersAreReplacedByTheSameSpareNodesEverywhere) {
  proto::ParityGroup g;
  for (const char* n : {"a", "b"}) g.add_data()->set_node(n);
  for (const char* n : {"c", "d", "e"}) g.add_parity_nodes(n);
  using V = std::vector<std::string>;
  EXPECT_EQ(ParityHolders(g, {"a", "b", "c", "d", "e", "f"}),
            (V{"c", "d", "e"}));
  // c and e lost: the live nodes outside the group, by id, in turn.
  EXPECT_EQ(ParityHolders(g, {"a", "b", "d", "g", "f"}), (V{"f", "d", "g"}));
  // Not enough spare nodes: "" for the block left without one.
  EXPECT_EQ(ParityHolders(g, {"a", "b", "d", "f"}), (V{"f", "d", ""}));
}

TEST(ParityPlanTest, LostDataNodesGetStandInsOutsideTheGroupFirst) {
  proto::ParityGroup g;
  for (const char* n : {"a", "b", "c"}) g.add_data()->set_node(n);
  for (const char* n : {"d", "e"}) g.add_parity_nodes(n);
  using V = std::vector<std::string>;
  // Nobody lost: no stand-in.
  EXPECT_EQ(DataStandIns(g, {"a", "b", "c", "d", "e", "f"}), (V{"", "", ""}));
  // a and c lost: the nodes with no block of the group, in turn.
  EXPECT_EQ(DataStandIns(g, {"b", "d", "e", "f", "g"}), (V{"f", "", "g"}));
  // d lost too: f holds parity block 0 in its place, so g stands in for a
  // first, then the parity holders (e, f) are used.
  EXPECT_EQ(ParityHolders(g, {"b", "e", "f", "g"}), (V{"f", "e"}));
  EXPECT_EQ(DataStandIns(g, {"b", "e", "f", "g"}), (V{"g", "", "e"}));
  // Only data nodes of the group left: none.
  EXPECT_EQ(DataStandIns(g, {"b"}), (V{"", "", ""}));
}

}  // namespace
}  // namespace ckpt::daemon
