// The memory tier's eviction rules (daemon/memory/memory_pressure.h) as pure
// functions: what is safe to drop, in which order, and that nothing goes in
// vain.
#include "daemon/memory/memory_pressure.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

using ::testing::IsEmpty;

proto::ShardRecord Shard(const std::string& job, uint64_t step, uint32_t rank,
                         proto::ShardState state = proto::SHARD_PERSISTED,
                         uint64_t bytes = 100) {
  proto::ShardRecord r;
  r.set_job(job);
  r.set_step(step);
  r.set_rank(rank);
  r.set_state(state);
  r.set_slot_path("/slots/" + job + "/" + std::to_string(step));
  r.set_slot_bytes(bytes);
  if (state == proto::SHARD_PERSISTED) r.set_shard_path("/shards/x");
  r.set_staged_unix_micros(static_cast<int64_t>(step) * 1000);
  return r;
}

TEST(WhyKeptTest, OnlyCopiesSafeAtADurableTierMayGo) {
  // Persisted here: the file holds the shard, whether or not the step's
  // other shards are persisted yet.
  EXPECT_EQ(WhyKept(Shard("j", 1, 0), {}), "");
  // Its file was retired by retention: the slot is the last local copy,
  // unless peers or the shared tier keep the step.
  proto::ShardRecord no_file = Shard("j", 3, 0);
  no_file.clear_shard_path();
  EXPECT_EQ(WhyKept(no_file, {}),
            "its shard file was retired: the memory copy is the last one here");
  EXPECT_EQ(WhyKept(no_file, {3}), "");
  EXPECT_EQ(WhyKept(Shard("j", 1, 0, proto::SHARD_STAGING), {}),
            "being staged");
  EXPECT_EQ(WhyKept(Shard("j", 1, 0, proto::SHARD_STAGED), {}),
            "being persisted");
  proto::ShardRecord retried = Shard("j", 1, 0, proto::SHARD_STAGED);
  retried.set_error("ENOSPC");
  EXPECT_EQ(WhyKept(retried, {}),
            "its persist failed and is being tried again");
  EXPECT_EQ(WhyKept(Shard("j", 1, 0, proto::SHARD_FAILED), {1}),
            "its persist failed: the memory copy is the only one");
  // A newer save of its rank took its place on the disk (--persist-newest).
  proto::ShardRecord skipped = Shard("j", 1, 0, proto::SHARD_STAGED);
  skipped.set_persist_skipped(true);
  EXPECT_EQ(WhyKept(skipped, {}), "");
}

class PlanEvictionTest : public ::testing::Test {
 protected:
  void Add(const proto::ShardRecord& r, std::string kept = "") {
    in_.copies.push_back({r, std::move(kept)});
  }
  std::vector<std::pair<std::string, uint64_t>> Plan(uint64_t needed) {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const Eviction& e : PlanEviction(in_, needed)) {
      out.push_back({e.shard.job(), e.shard.step()});
      reasons_.push_back(e.reason);
    }
    return out;
  }
  PressureInput in_;
  std::vector<EvictionReason> reasons_;
  const absl::Time now_ = absl::FromUnixSeconds(1'000'000);
};

TEST_F(PlanEvictionTest, IdleJobsGoFirstLeastRecentlyActiveFirst) {
  in_.now = now_;
  in_.saving_job = "new";
  // "old" stopped an hour ago, "older" two hours ago; "busy" has a trainer.
  in_.jobs["old"].last_save = now_ - absl::Hours(1);
  in_.jobs["old"].detached = now_ - absl::Hours(1);
  in_.jobs["older"].last_save = now_ - absl::Hours(2);
  in_.jobs["older"].detached = now_ - absl::Hours(2);
  in_.jobs["busy"].sessions = 1;
  in_.jobs["busy"].last_save = now_ - absl::Seconds(5);
  Add(Shard("busy", 7, 0));
  Add(Shard("busy", 8, 0));
  Add(Shard("old", 3, 0));
  Add(Shard("old", 4, 0));
  Add(Shard("older", 9, 0));
  Add(Shard("new", 1, 0));
  using P = std::pair<std::string, uint64_t>;
  EXPECT_EQ(Plan(150), (std::vector<P>{{"older", 9}, {"old", 3}}));
  EXPECT_EQ(reasons_[0], EvictionReason::kIdleJob);
  reasons_.clear();
  // Then the older steps of active jobs, then newest steps, the saving
  // job's own last.
  EXPECT_EQ(Plan(600), (std::vector<P>{{"older", 9},
                                       {"old", 3},
                                       {"old", 4},
                                       {"busy", 7},
                                       {"busy", 8},
                                       {"new", 1}}));
  EXPECT_EQ(reasons_[3], EvictionReason::kOlderStep);
  EXPECT_EQ(reasons_[4], EvictionReason::kNewestStep);
  EXPECT_EQ(reasons_[5], EvictionReason::kNewestStep);
}

TEST_F(PlanEvictionTest, AJobThatSavedRecentlyIsActiveWithoutASession) {
  in_.now = now_;
  in_.jobs["a"].last_save = now_ - absl::Seconds(10);
  in_.jobs["b"].last_save = now_ - absl::Minutes(5);
  Add(Shard("a", 1, 0));
  Add(Shard("b", 1, 0));
  using P = std::pair<std::string, uint64_t>;
  EXPECT_EQ(Plan(100), (std::vector<P>{{"b", 1}}));
  // A job never heard of since the daemon started is idle.
  in_.jobs.clear();
  in_.jobs["a"].last_save = now_ - absl::Seconds(10);
  EXPECT_EQ(Plan(100), (std::vector<P>{{"b", 1}}));
  // A job whose trainers attached and all left is idle at once.
  in_.jobs["b"].last_save = now_;
  in_.jobs["b"].ever_attached = true;
  EXPECT_EQ(Plan(100), (std::vector<P>{{"b", 1}}));
  in_.jobs["b"].sessions = 1;
  EXPECT_EQ(Plan(100), (std::vector<P>{{"a", 1}}));
}

TEST_F(PlanEvictionTest, CopiesThatMustStayOrAreHeldNeverGo) {
  in_.now = now_;
  Add(Shard("a", 1, 0), "being persisted");
  Add(Shard("a", 2, 0), "its persist failed: the memory copy is the only one");
  Add(Shard("a", 3, 0));
  Add(Shard("a", 4, 0));
  in_.pinned = [](const proto::ShardRecord& r) { return r.step() == 3; };
  using P = std::pair<std::string, uint64_t>;
  EXPECT_EQ(Plan(100), (std::vector<P>{{"a", 4}}));
  // What may go cannot cover 200 bytes: nothing goes in vain.
  EXPECT_THAT(Plan(200), IsEmpty());
  EXPECT_THAT(Plan(0), IsEmpty());
}

}  // namespace
}  // namespace ckpt::daemon
