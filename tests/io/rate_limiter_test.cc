// RateLimiter's schedule, on a clock the test moves: sends pace at the rate
// once the burst is spent, idling earns no more than the burst, and the
// bytes acquired are counted. No timing: the sleeps are recorded, not slept.
#include "io/rate_limiter.h"

#include <vector>

#include "gtest/gtest.h"

namespace ckpt::io {
namespace {

class RateLimiterTest : public ::testing::Test {
 protected:
  RateLimiter::Clock Clock() {
    RateLimiter::Clock clock;
    clock.now = [this] { return now_; };
    clock.sleep = [this](absl::Duration d) {
      slept_.push_back(d);
      now_ += d;
    };
    return clock;
  }
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::vector<absl::Duration> slept_;
};

TEST_F(RateLimiterTest, PacesAtTheRateOnceTheBurstIsSpent) {
  // 100 bytes/s, a burst of 10 bytes (0.1 s).
  RateLimiter limiter(100, 10, Clock());
  const absl::Time start = now_;
  for (int i = 0; i < 12; ++i) limiter.Acquire(10);
  // 120 bytes at 100 bytes/s, less what the burst let through at once.
  EXPECT_EQ(now_ - start, absl::Milliseconds(1000));
  EXPECT_EQ(limiter.acquired(), 120u);
  // Every piece after the first two waited its 0.1 s.
  ASSERT_EQ(slept_.size(), 10u);
  for (absl::Duration d : slept_) EXPECT_EQ(d, absl::Milliseconds(100));
}

TEST_F(RateLimiterTest, IdlingEarnsNoMoreThanTheBurst) {
  RateLimiter limiter(100, 10, Clock());
  limiter.Acquire(10);
  now_ += absl::Hours(1);  // idle
  const absl::Time start = now_;
  for (int i = 0; i < 5; ++i) limiter.Acquire(10);
  // Not an hour's worth of credit: 50 bytes take 0.3 s after the burst.
  EXPECT_EQ(now_ - start, absl::Milliseconds(300));
}

TEST_F(RateLimiterTest, ABigPieceWaitsForItsShare) {
  RateLimiter limiter(1 << 20, 1 << 20, Clock());
  limiter.Acquire(1 << 20);  // the burst
  const absl::Time start = now_;
  limiter.Acquire(4 << 20);
  limiter.Acquire(1);
  // 4 MiB at 1 MiB/s: the piece goes once all but the last second (the
  // burst) of it is paid, 3 s on; the byte right after it.
  EXPECT_GE(now_ - start, absl::Seconds(3));
  EXPECT_LT(now_ - start, absl::Seconds(4));
}

}  // namespace
}  // namespace ckpt::io
