#include "daemon/persist/persist_queue.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

TEST(PersistQueueTest, EachRankPersistsInStepOrderWhileOtherRanksGoAhead) {
  PersistQueue q;
  q.Add({"j", 1, 0});
  q.Add({"j", 2, 0});
  q.Add({"j", 1, 1});
  std::optional<PersistQueue::Work> a = q.Next();
  ASSERT_TRUE(a && a->shard);
  EXPECT_EQ(*a->shard, (SlotId{"j", 1, 0}));
  // Rank 0's step 2 waits for its step 1: rank 1 goes first.
  std::optional<PersistQueue::Work> b = q.Next();
  ASSERT_TRUE(b && b->shard);
  EXPECT_EQ(*b->shard, (SlotId{"j", 1, 1}));
  EXPECT_TRUE(q.Persisting());
  q.Done(*a->shard);
  std::optional<PersistQueue::Work> c = q.Next();
  ASSERT_TRUE(c && c->shard);
  EXPECT_EQ(*c->shard, (SlotId{"j", 2, 0}));
  q.Done(*b->shard);
  q.Done(*c->shard);
  EXPECT_FALSE(q.Persisting());
}

// Newest only: a rank's newer shard takes the place of its older ones still
// waiting, never of one in flight or of another rank's.
TEST(PersistQueueTest, NewestOnlySkipsTheRanksOlderWaitingShards) {
  PersistQueue q;
  EXPECT_TRUE(q.Add({"j", 1, 0}, true).empty());
  std::optional<PersistQueue::Work> first = q.Next();  // step 1 in flight
  ASSERT_TRUE(first && first->shard);
  EXPECT_TRUE(q.Add({"j", 2, 0}, true).empty());
  EXPECT_TRUE(q.Add({"j", 2, 1}, true).empty());
  EXPECT_TRUE(q.Add({"other", 1, 0}, true).empty());
  EXPECT_EQ(q.Add({"j", 3, 0}, true), (std::vector<SlotId>{{"j", 2, 0}}));
  EXPECT_EQ(q.Add({"j", 4, 0}, true), (std::vector<SlotId>{{"j", 3, 0}}));
  EXPECT_TRUE(q.Add({"j", 5, 0}, false).empty()) << "not newest only";
  q.Done(*first->shard);
  std::vector<SlotId> order;
  for (int i = 0; i < 4; ++i) {
    std::optional<PersistQueue::Work> w = q.Next();
    ASSERT_TRUE(w && w->shard);
    order.push_back(*w->shard);
    q.Done(*w->shard);
  }
  EXPECT_EQ(order,
            (std::vector<SlotId>{
                {"j", 2, 1}, {"other", 1, 0}, {"j", 4, 0}, {"j", 5, 0}}));
}

TEST(PersistQueueTest, APersistAsksForItsJobsCollectionOnceAndItComesLast) {
  PersistQueue q;
  q.RequestGc("other");
  q.Add({"j", 1, 0});
  std::optional<PersistQueue::Work> persist = q.Next();
  ASSERT_TRUE(persist && persist->shard) << "persisting goes first";
  q.Done(*persist->shard);
  q.RequestGc("j");  // asked twice: collected once
  std::set<std::string> collected;
  for (int i = 0; i < 2; ++i) {
    std::optional<PersistQueue::Work> gc = q.Next();
    ASSERT_TRUE(gc && !gc->shard);
    collected.insert(gc->gc_job);
    q.GcDone();
  }
  EXPECT_EQ(collected, (std::set<std::string>{"j", "other"}));
  // Nothing else is owed: WaitIdle returns.
  q.WaitIdle();
}

TEST(PersistQueueTest, WithdrawTakesAQueuedShardOutAndWaitsOutOneInFlight) {
  PersistQueue q;
  q.Add({"j", 1, 0});
  q.Add({"j", 2, 0});
  EXPECT_TRUE(q.Withdraw({"j", 2, 0}));
  EXPECT_FALSE(q.Withdraw({"j", 9, 0})) << "never queued";
  std::optional<PersistQueue::Work> w = q.Next();
  ASSERT_TRUE(w && w->shard);
  EXPECT_EQ(*w->shard, (SlotId{"j", 1, 0}));
  // Step 1 is being persisted: withdrawing it waits for Done.
  std::atomic<bool> withdrawn{false};
  std::thread t([&] {
    EXPECT_FALSE(q.Withdraw({"j", 1, 0}));
    withdrawn = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(withdrawn) << "returned while the persist was in flight";
  q.Done(*w->shard);
  t.join();
  EXPECT_TRUE(withdrawn);
  std::optional<PersistQueue::Work> gc = q.Next();
  ASSERT_TRUE(gc && !gc->shard) << "step 2 was withdrawn";
  EXPECT_EQ(gc->gc_job, "j");
  q.GcDone();
  q.WaitIdle();
}

TEST(PersistQueueTest, StopWakesTheThreadsAndLeavesQueuedWorkUndone) {
  PersistQueue q;
  EXPECT_FALSE(q.WaitForStop(absl::Milliseconds(1)));
  absl::Notification idle_thread_done;
  std::thread t([&] {
    EXPECT_FALSE(q.Next().has_value());
    idle_thread_done.Notify();
  });
  q.Stop();
  t.join();
  EXPECT_TRUE(idle_thread_done.HasBeenNotified());
  q.Add({"j", 1, 0});
  EXPECT_FALSE(q.Next().has_value()) << "no work after Stop";
  EXPECT_TRUE(q.WaitForStop(absl::ZeroDuration()));
}

}  // namespace
}  // namespace ckpt::daemon
