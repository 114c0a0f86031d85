// HangWatch: a rank whose session is open and whose saves stopped is hung
// once past `after` and ten save intervals, reported once until it saves
// again; ranks without a session never are; ckptd's own pause restarts the
// clocks.
#include "daemon/health/hang_watch.h"

#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

absl::Time T(double seconds) {
  return absl::FromUnixMicros(1'000'000'000'000 +
                              static_cast<int64_t>(seconds * 1e6));
}

// Checks every half second from `from` to `to`; the ranks found hung, with
// when.
std::vector<std::pair<double, HangWatch::Hung>> Watch(HangWatch& w, double from,
                                                      double to) {
  std::vector<std::pair<double, HangWatch::Hung>> found;
  for (double t = from; t <= to + 1e-9; t += 0.5) {
    for (HangWatch::Hung& h : w.Check(T(t))) found.push_back({t, h});
  }
  return found;
}

TEST(HangWatchTest, ASilentRankWithASessionIsHungOnceUntilItSaves) {
  HangWatch w(absl::Seconds(5));
  w.SessionBegun("j", 0, 100, T(0));
  w.SessionBegun("j", 1, 101, T(0));
  w.SessionBegun("j", 2, 102, T(0));
  w.SessionEnded("j", 2, 102);     // rank 2 is gone: never hung
  for (int i = 0; i <= 10; ++i) {  // saves 1 s apart
    w.Saved("j", 0, 1, T(i));
    w.Done("j", 0, T(i));
    w.Saved("j", 1, 1, T(i));
    w.Done("j", 1, T(i));
  }
  EXPECT_TRUE(Watch(w, 0, 10).empty());
  // Rank 1 stops at 10 s; rank 0 goes on. Ten intervals (10 s) > 5 s.
  for (int i = 11; i <= 40; ++i) {
    w.Saved("j", 0, 1, T(i));
    w.Done("j", 0, T(i));
  }
  std::vector<std::pair<double, HangWatch::Hung>> found = Watch(w, 10.5, 40);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].first, 20);
  EXPECT_EQ(found[0].second.rank, 1u);
  EXPECT_EQ(found[0].second.pid, 101u);
  EXPECT_EQ(found[0].second.silent, absl::Seconds(10));
  EXPECT_EQ(found[0].second.interval, absl::Seconds(1));
  // It saves again, then hangs again: a second hang.
  w.Saved("j", 1, 1, T(41));
  w.Done("j", 1, T(41));
  for (int i = 41; i <= 70; ++i) {
    w.Saved("j", 0, 1, T(i));
    w.Done("j", 0, T(i));
  }
  found = Watch(w, 40.5, 60);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].first, 51);
  // Its session ends (killed, or it finished): no longer watched.
  w.SessionEnded("j", 1, 101);
  w.SessionBegun("j", 1, 103, T(61));
  EXPECT_TRUE(Watch(w, 60.5, 70).empty());
}

TEST(HangWatchTest, TheDaemonsOwnPauseIsNotTheTrainers) {
  HangWatch w(absl::Seconds(2));
  w.SessionBegun("j", 0, 100, T(0));
  for (int i = 0; i <= 10; ++i) {
    w.Saved("j", 0, 1, T(i / 10.0));
    w.Done("j", 0, T(i / 10.0));
  }
  EXPECT_TRUE(Watch(w, 0, 1).empty());
  // ckptd stopped from 1 s to 4 s: the rank could not save meanwhile.
  EXPECT_TRUE(w.Check(T(4)).empty());
  w.Saved("j", 0, 1, T(4.2));
  w.Done("j", 0, T(4.2));
  EXPECT_TRUE(Watch(w, 4.5, 6).empty());
  // A real hang after that is seen.
  std::vector<std::pair<double, HangWatch::Hung>> found = Watch(w, 6.5, 8);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].first, 6.5);

  // A save that waits in ckptd (for memory) is no hang; once it returns the
  // rank's clock starts.
  w.Saved("j", 0, 1, T(8));
  EXPECT_TRUE(Watch(w, 8.5, 20).empty());
  w.Done("j", 0, T(20));
  EXPECT_TRUE(Watch(w, 20.5, 21.5).empty());
  EXPECT_EQ(Watch(w, 22, 22).size(), 1u);

  // A rank that saved step 9 and waits for it to commit (its peer has not
  // saved it) is no hang; the peer is.
  w.SessionBegun("j", 1, 101, T(22));
  w.Saved("j", 0, 9, T(22));
  w.Done("j", 0, T(22));
  w.Saved("j", 1, 8, T(22));
  w.Done("j", 1, T(22));
  w.WaitBegun("j", 9);
  found = Watch(w, 22.5, 30);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].second.rank, 1u);
  w.WaitEnded("j", 9, T(30));
  EXPECT_TRUE(Watch(w, 30.5, 31.5).empty()) << "its clock starts over";

  HangWatch never(absl::InfiniteDuration());
  never.SessionBegun("j", 0, 100, T(0));
  EXPECT_TRUE(Watch(never, 0, 100).empty());
}

}  // namespace
}  // namespace ckpt::daemon
