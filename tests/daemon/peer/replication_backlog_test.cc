#include "daemon/peer/replication_backlog.h"

#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

TEST(ReplicationBacklogTest, ABurstWithinTheThresholdIsPushedWhole) {
  EXPECT_FALSE(ChooseFromBacklog({5, 6, 7, 8}, {}, 4).thinned);
  EXPECT_FALSE(ChooseFromBacklog({}, {}, 0).thinned);
}

TEST(ReplicationBacklogTest,
     WithNoVotesTheNewestStepGoesAndTheOlderAreDropped) {
  BacklogChoice c = ChooseFromBacklog({10, 11, 12, 13, 14, 15}, {}, 4);
  ASSERT_TRUE(c.thinned);
  EXPECT_EQ(c.push, 15u);
  EXPECT_EQ(c.dropped, (std::set<uint64_t>{10, 11, 12, 13, 14}));
  EXPECT_TRUE(c.later.empty());
}

TEST(ReplicationBacklogTest, TheNewestStepOthersReplicatedGoesFirst) {
  // Another node replicated 12 and 13 (votes of steps this node does not
  // wait on, like 30, do not count): 13 goes, 14 and 15 wait.
  BacklogChoice c =
      ChooseFromBacklog({10, 11, 12, 13, 14, 15}, {12, 13, 30}, 4);
  ASSERT_TRUE(c.thinned);
  EXPECT_EQ(c.push, 13u);
  EXPECT_EQ(c.dropped, (std::set<uint64_t>{10, 11, 12}));
  EXPECT_EQ(c.later, (std::set<uint64_t>{14, 15}));
}

// Two nodes behind by different amounts: whoever goes first, the other
// follows its vote and the step commits.
TEST(ReplicationBacklogTest, NodesBehindByDifferentAmountsConverge) {
  std::set<uint64_t> a_waiting, b_waiting;
  for (uint64_t s = 100; s <= 150; ++s) a_waiting.insert(s);
  for (uint64_t s = 100; s <= 140; ++s) b_waiting.insert(s);
  BacklogChoice a = ChooseFromBacklog(a_waiting, {}, 4);
  EXPECT_EQ(a.push, 150u);
  // B has not persisted 150 yet: it pushes its own newest, 140.
  BacklogChoice b = ChooseFromBacklog(b_waiting, {150}, 4);
  EXPECT_EQ(b.push, 140u);
  // Next rounds: A waits on 151..170, B on 141..165 (150 among them).
  std::set<uint64_t> a2, b2;
  for (uint64_t s = 151; s <= 170; ++s) a2.insert(s);
  for (uint64_t s = 141; s <= 165; ++s) b2.insert(s);
  BacklogChoice a_next = ChooseFromBacklog(a2, {140}, 4);
  BacklogChoice b_next = ChooseFromBacklog(b2, {140, 150, 170}, 4);
  EXPECT_EQ(a_next.push, 170u);
  EXPECT_EQ(b_next.push, 150u);  // both ranks of 150 now replicated
}

}  // namespace
}  // namespace ckpt::daemon
