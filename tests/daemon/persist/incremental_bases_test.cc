#include "daemon/persist/incremental_bases.h"

#include <thread>

#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

IncrementalBases::Base BaseOf(uint64_t step) {
  auto base = std::make_shared<snapshot::ShardBase>();
  base->manifest.set_step(step);
  return base;
}

std::vector<uint64_t> Steps(const std::vector<IncrementalBases::Base>& bases) {
  std::vector<uint64_t> steps;
  for (const auto& b : bases) steps.push_back(b->manifest.step());
  return steps;
}

TEST(IncrementalBasesTest, KeepsEachRanksNewestCandidatesNewestFirst) {
  IncrementalBases bases;
  for (uint64_t step = 1; step <= 6; ++step)
    bases.Remember("j", 0, step, BaseOf(step));
  bases.Remember("j", 1, 3, BaseOf(3));
  bases.Remember("k", 0, 9, BaseOf(9));
  ASSERT_EQ(IncrementalBases::kCandidates, 4u);
  EXPECT_EQ(Steps(bases.Candidates("j", 0)),
            (std::vector<uint64_t>{6, 5, 4, 3}));
  EXPECT_EQ(Steps(bases.Candidates("j", 1)), (std::vector<uint64_t>{3}));
  EXPECT_TRUE(bases.Candidates("j", 7).empty());
  // A rewritten file replaces its candidate; a step no longer kept stays out.
  auto rewritten = BaseOf(5);
  bases.Replace("j", 0, 5, rewritten);
  bases.Replace("j", 0, 1, BaseOf(1));
  EXPECT_EQ(bases.Candidates("j", 0)[1], rewritten);
  EXPECT_EQ(bases.Candidates("j", 0).size(), 4u);
  bases.Forget("j");
  EXPECT_TRUE(bases.Candidates("j", 0).empty());
  EXPECT_TRUE(bases.Candidates("j", 1).empty());
  EXPECT_EQ(Steps(bases.Candidates("k", 0)), (std::vector<uint64_t>{9}));
}

TEST(IncrementalBasesTest, PinsCountAndOnlyAFileStillThereIsPinned) {
  IncrementalBases bases;
  EXPECT_FALSE(bases.Pin("j", 0, 4, [] { return false; })) << "dropped";
  EXPECT_TRUE(bases.Pinned("j").empty());
  ASSERT_TRUE(bases.Pin("j", 0, 4, [] { return true; }));
  ASSERT_TRUE(bases.Pin("j", 0, 4, [] { return true; }));
  ASSERT_TRUE(bases.Pin("j", 2, 7, [] { return true; }));
  ASSERT_TRUE(bases.Pin("jj", 0, 1, [] { return true; }));
  using Pins = std::set<std::pair<uint32_t, uint64_t>>;
  EXPECT_EQ(bases.Pinned("j"), (Pins{{0, 4}, {2, 7}})) << "not job jj's";
  bases.Unpin("j", 0, 4);
  {
    IncrementalBases::Freeze frozen(bases);
    EXPECT_TRUE(frozen.Pinned("j", 0, 4)) << "pinned twice, unpinned once";
    EXPECT_FALSE(frozen.Pinned("j", 0, 5));
  }
  bases.Unpin("j", 0, 4);
  EXPECT_EQ(bases.Pinned("j"), (Pins{{2, 7}}));
}

TEST(IncrementalBasesTest, WaitUnpinnedWaitsForTheLastPersistAndNamesTheShard) {
  IncrementalBases bases;
  EXPECT_TRUE(bases.WaitUnpinned("j", 0, 4, absl::ZeroDuration()).ok());
  ASSERT_TRUE(bases.Pin("j", 0, 4, [] { return true; }));
  absl::Status late = bases.WaitUnpinned("j", 0, 4, absl::Milliseconds(20));
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(late.message().find("job j step 4 rank 0 is still the base"),
            std::string::npos)
      << late;
  std::thread persist([&] {
    absl::SleepFor(absl::Milliseconds(30));
    bases.Unpin("j", 0, 4);
  });
  EXPECT_TRUE(bases.WaitUnpinned("j", 0, 4, absl::Minutes(1)).ok());
  persist.join();
}

// A pin that comes while a collection holds the pins frozen waits for it:
// the collection's check and its records' update are one.
TEST(IncrementalBasesTest, APinWaitsForAFrozenCollection) {
  IncrementalBases bases;
  std::atomic<bool> pinned{false};
  std::thread persist;
  {
    IncrementalBases::Freeze frozen(bases);
    persist = std::thread(
        [&] { pinned = bases.Pin("j", 0, 4, [] { return true; }); });
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_FALSE(pinned);
    EXPECT_FALSE(frozen.Pinned("j", 0, 4));
  }
  persist.join();
  EXPECT_TRUE(pinned);
}

}  // namespace
}  // namespace ckpt::daemon
