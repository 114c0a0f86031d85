// The fan-out's shape: a chain or a tree rooted at the source, each node's
// fallbacks up the tree, then the holders, then the other subscribers; the
// automatic degree.
#include "daemon/publish/fanout.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Not;

FanoutNodes Nodes() {
  FanoutNodes nodes;
  nodes.source = "src";
  nodes.subscribers = {"d", "b", "c", "e", "f", "g", "h"};
  return nodes;
}

TEST(FanoutTest, AChainForwardsToTheNextNodeAndFallsBackUpstream) {
  const FanoutNodes nodes = Nodes();
  // The chain: src, b, c, d, e, f, g, h.
  EXPECT_EQ(FetchOrder(nodes, "b", 1).front(), "src");
  std::vector<std::string> d = FetchOrder(nodes, "d", 1);
  // Up the chain first, the source last of them; then the rest.
  EXPECT_THAT(std::vector<std::string>(d.begin(), d.begin() + 3),
              ElementsAre("c", "b", "src"));
  EXPECT_THAT(d, Not(Contains("d")));
  EXPECT_EQ(d.size(), 7u);  // every other node once
}

TEST(FanoutTest, ATreeOfDegreeTwo) {
  const FanoutNodes nodes = Nodes();
  // Heap order: src(0) b(1) c(2) d(3) e(4) f(5) g(6) h(7).
  EXPECT_EQ(FetchOrder(nodes, "b", 2).front(), "src");
  EXPECT_EQ(FetchOrder(nodes, "c", 2).front(), "src");
  std::vector<std::string> h = FetchOrder(nodes, "h", 2);
  EXPECT_THAT(std::vector<std::string>(h.begin(), h.begin() + 3),
              ElementsAre("d", "b", "src"));
  std::vector<std::string> g = FetchOrder(nodes, "g", 2);
  EXPECT_THAT(std::vector<std::string>(g.begin(), g.begin() + 2),
              ElementsAre("c", "src"));
}

TEST(FanoutTest, HoldersComeBeforeTheOtherSubscribers) {
  FanoutNodes nodes = Nodes();
  nodes.holders = {"g"};
  std::vector<std::string> c = FetchOrder(nodes, "c", 1);
  EXPECT_THAT(std::vector<std::string>(c.begin(), c.begin() + 3),
              ElementsAre("b", "src", "g"));
}

TEST(FanoutTest, ALateJoinerNotYetListedGoesLast) {
  FanoutNodes nodes = Nodes();
  nodes.holders = {"b", "c"};
  std::vector<std::string> z = FetchOrder(nodes, "z", 1);
  EXPECT_EQ(z.front(), "h");  // the chain's last node
  EXPECT_THAT(z, Contains("src"));
  EXPECT_THAT(z, Not(Contains("z")));
}

TEST(FanoutTest, TheSourceAsASubscriberIsStillTheRoot) {
  FanoutNodes nodes = Nodes();
  nodes.subscribers.push_back("src");
  EXPECT_EQ(FetchOrder(nodes, "b", 1).front(), "src");
  EXPECT_THAT(FetchOrder(nodes, "src", 1), Not(Contains("src")));
}

TEST(FanoutTest, AutoDegreeIsAChainUnlessSubscribersOutnumberPieces) {
  EXPECT_EQ(AutoDegree(8, 2ull << 30), 1);
  EXPECT_EQ(AutoDegree(256, 2ull << 30), 1);
  EXPECT_EQ(AutoDegree(64, 4 * kFanoutPieceBytes), 2);
  EXPECT_EQ(AutoDegree(1, 10), 1);
}

}  // namespace
}  // namespace ckpt::daemon
