// The shared tier's folder names and its retention plan
// (snapshot/shared_layout.h).
#include "snapshot/shared_layout.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapshot/format.h"

namespace ckpt::snapshot {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

std::string CopyName(uint64_t step, uint32_t rank) {
  return ShardFileName(step, rank, ".ckpt");
}

TEST(SharedLayoutTest, NamesParseBackAndOthersDoNot) {
  uint64_t step = 0, base = 0;
  uint32_t rank = 0;
  EXPECT_TRUE(ParseCopyName(CopyName(42, 7), &step, &rank));
  EXPECT_EQ(step, 42u);
  EXPECT_EQ(rank, 7u);
  EXPECT_TRUE(ParseMarkerName(CommitMarkerName(9), &step));
  EXPECT_EQ(step, 9u);
  EXPECT_TRUE(ParsePinName(PinName(3, 1, 5), &base, &rank, &step));
  EXPECT_EQ(base, 3u);
  EXPECT_EQ(rank, 1u);
  EXPECT_EQ(step, 5u);
  for (const std::string& other :
       {CopyName(1, 0) + ".partial", std::string("notes.txt"),
        std::string("00000000000000000001.commit.tmp"), PinName(1, 0, 2) + "x",
        std::string("1-0.ckpt")}) {
    EXPECT_FALSE(ParseCopyName(other, &step, &rank)) << other;
    EXPECT_FALSE(ParseMarkerName(other, &step)) << other;
    EXPECT_FALSE(ParsePinName(other, &base, &rank, &step)) << other;
  }
}

// Steps 1..5 committed (two ranks), step 6 being copied; step 4's copy of
// rank 1 is an increment over step 2's, step 5's over step 4's. Keeping two
// (4 and 5): steps 1 and 3 go whole, step 2 keeps rank 1's copy (a base
// through the chain) and loses rank 0's; markers of 1..3 go first.
TEST(SharedLayoutTest, RetentionKeepsTheNewestAndTheBasesTheyReadFrom) {
  std::vector<std::string> names;
  for (uint64_t step = 1; step <= 6; ++step) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      names.push_back(CopyName(step, rank));
    }
    if (step <= 5) names.push_back(CommitMarkerName(step));
  }
  names.push_back(PinName(2, 1, 4));
  names.push_back(PinName(4, 1, 5));
  names.push_back(PinName(1, 0, 3));             // step 3 goes: its pin too
  names.push_back(CopyName(3, 0) + ".partial");  // another's copy in flight
  const SharedRetention plan = PlanSharedRetention(names, {5, 3, 4, 1, 2}, 2);
  EXPECT_EQ(plan.oldest_kept, 4u);
  EXPECT_THAT(plan.markers,
              UnorderedElementsAre(CommitMarkerName(1), CommitMarkerName(2),
                                   CommitMarkerName(3)));
  EXPECT_THAT(
      plan.copies,
      UnorderedElementsAre(CopyName(1, 0), CopyName(1, 1), CopyName(2, 0),
                           CopyName(3, 0), CopyName(3, 1), PinName(1, 0, 3)));
  EXPECT_THAT(plan.dropped_steps, ElementsAre(1, 2, 3));
  EXPECT_THAT(plan.pinned_steps, ElementsAre(2));
}

TEST(SharedLayoutTest, NothingCommittedDropsNothing) {
  const SharedRetention plan =
      PlanSharedRetention({CopyName(1, 0), CopyName(2, 0)}, {}, 1);
  EXPECT_EQ(plan.oldest_kept, 0u);
  EXPECT_THAT(plan.markers, IsEmpty());
  EXPECT_THAT(plan.copies, IsEmpty());
}

TEST(SharedLayoutTest, KeepingMoreThanThereAreDropsNothingCommitted) {
  const SharedRetention plan = PlanSharedRetention(
      {CopyName(1, 0), CommitMarkerName(2), CopyName(2, 0)}, {2}, 3);
  EXPECT_EQ(plan.oldest_kept, 2u);
  EXPECT_THAT(plan.markers, IsEmpty());
  EXPECT_THAT(plan.copies, ElementsAre(CopyName(1, 0)));  // never committed
}

}  // namespace
}  // namespace ckpt::snapshot
