#include "io/rate_limiter.h"

#include <algorithm>

namespace ckpt::io {

RateLimiter::RateLimiter(uint64_t bytes_per_second, uint64_t burst, Clock clock)
    : rate_(std::max<uint64_t>(bytes_per_second, 1)),
      burst_(absl::Seconds(
          static_cast<double>(
              burst != 0 ? burst
                         : std::max<uint64_t>(rate_ / 10, uint64_t{1} << 20)) /
          static_cast<double>(rate_))),
      clock_(std::move(clock)) {}

void RateLimiter::Acquire(uint64_t bytes) {
  absl::Time start;
  absl::Time now;
  {
    absl::MutexLock lock(&mu_);
    now = clock_.now();
    // Time idle beyond the burst is not credit.
    paid_until_ = std::max(paid_until_, now - burst_);
    paid_until_ +=
        absl::Seconds(static_cast<double>(bytes) / static_cast<double>(rate_));
    acquired_ += bytes;
    // The piece may go once what it pays for lies within the burst.
    start = paid_until_ - burst_;
  }
  if (start > now) clock_.sleep(start - now);
}

uint64_t RateLimiter::acquired() const {
  absl::MutexLock lock(&mu_);
  return acquired_;
}

}  // namespace ckpt::io
