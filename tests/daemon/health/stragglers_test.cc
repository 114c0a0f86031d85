// Stragglers: a rank that keeps arriving in its steps' tail is flagged with
// its node, mean lag and step interval; ranks whose lags are noise below
// the floor, or a rank slow once, are not; a flag goes when the rank
// catches up. Randomized noise: the seed is printed.
#include "daemon/health/stragglers.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

using ::testing::IsEmpty;

// Step `step` of job "j" on 8 ranks, rank r's shard arriving lag(r) after
// the step began (steps 10 s apart).
template <typename Lag>
proto::ReplicaCheck Step(uint64_t step, Lag lag) {
  proto::ReplicaCheck c;
  c.set_job("j");
  c.set_step(step);
  std::vector<int64_t> at;
  for (uint32_t r = 0; r < 8; ++r) at.push_back(lag(r));
  const int64_t first = *std::min_element(at.begin(), at.end());
  for (uint32_t r = 0; r < 8; ++r) {
    proto::RankArrival& a = *c.add_arrivals();
    a.set_rank(r);
    a.set_node(r < 4 ? "node-a" : "node-b");
    a.set_staged_unix_micros(static_cast<int64_t>(step) * 10'000'000 + at[r]);
    a.set_lag_micros(at[r] - first);
  }
  return c;
}

TEST(StragglersTest, ARankKeptInTheTailIsFlaggedWithItsNode) {
  Metrics metrics;
  Stragglers s(&metrics);
  const uint32_t seed = std::random_device()();
  std::mt19937 random(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::uniform_int_distribution<int64_t> noise(0, 20'000);  // < 20 ms
  auto slow6 = [&](uint32_t r) {
    return noise(random) + (r == 6 ? 400'000 : 0);
  };
  for (uint64_t step = 1; step <= 4; ++step) s.Saw(Step(step, slow6));
  EXPECT_THAT(s.Flagged("j"), IsEmpty()) << "fewer steps than the window";
  s.Saw(Step(5, slow6));
  std::vector<Stragglers::Flag> flagged = s.Flagged("j");
  ASSERT_EQ(flagged.size(), 1u);
  EXPECT_EQ(flagged[0].rank, 6u);
  EXPECT_EQ(flagged[0].node, "node-b");
  EXPECT_EQ(flagged[0].tail_steps, 5);
  EXPECT_NEAR(flagged[0].mean_lag_s, 0.4, 0.03);
  EXPECT_NEAR(flagged[0].interval_s, 10, 0.01);
  EXPECT_NEAR(flagged[0].job_interval_s, 10, 0.01);
  EXPECT_THAT(metrics.Render(),
              ::testing::HasSubstr("ckpt_stragglers{job=\"j\"} 1"));
  // It catches up: after two steps out of the tail it is no longer flagged.
  auto even = [&](uint32_t) { return noise(random); };
  s.Saw(Step(6, even));
  EXPECT_EQ(s.Flagged("j").size(), 1u) << "still 4 of the last 5";
  s.Saw(Step(7, even));
  EXPECT_THAT(s.Flagged("j"), IsEmpty());
  EXPECT_THAT(metrics.Render(),
              ::testing::HasSubstr("ckpt_stragglers{job=\"j\"} 0"));
}

TEST(StragglersTest, NoiseAndASlowStepFlagNobody) {
  Metrics metrics;
  Stragglers s(&metrics);
  const uint32_t seed = std::random_device()();
  std::mt19937 random(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::uniform_int_distribution<int64_t> noise(0, 40'000);  // < the floor
  for (uint64_t step = 1; step <= 20; ++step) {
    // Rank 3 always last, but by noise alone; step 10 slow for rank 5 once.
    s.Saw(Step(step, [&](uint32_t r) {
      return noise(random) + (r == 3 ? 5'000 : 0) +
             (step == 10 && r == 5 ? 2'000'000 : 0);
    }));
    EXPECT_THAT(s.Flagged("j"), IsEmpty()) << "step " << step;
  }
  // Steps seen again, or older than the window, change nothing.
  s.Saw(Step(3, [](uint32_t r) { return r == 1 ? 9'000'000 : 0; }));
  EXPECT_THAT(s.Flagged("j"), IsEmpty());
}

}  // namespace
}  // namespace ckpt::daemon
