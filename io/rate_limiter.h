// RateLimiter caps the bytes a daemon sends to its peers per second
// (ckptd's --peer-send-rate): replicas, parity contributions, copies served
// to restores and published versions forwarded to subscribers all draw on
// one limiter, so checkpoint traffic cannot starve the training job's own
// collectives.
//
// Each sender asks for its next piece before sending it: Acquire(n) returns
// once the piece fits the rate, sleeping until then. A limiter idle for a
// while lets a burst of `burst` bytes through at once, no more. The clock and
// the sleep are injectable, so the schedule is tested without timing.
//
// Thread-safety: thread-safe; senders are served in the order they asked.
#ifndef CKPT_IO_RATE_LIMITER_H_
#define CKPT_IO_RATE_LIMITER_H_

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckpt::io {

class RateLimiter {
 public:
  struct Clock {
    std::function<absl::Time()> now = [] { return absl::Now(); };
    std::function<void(absl::Duration)> sleep = [](absl::Duration d) {
      absl::SleepFor(d);
    };
  };
  // `bytes_per_second` > 0; `burst`: bytes let through at once after idling
  // (0: 1/10 s of the rate, at least 1 MiB).
  explicit RateLimiter(uint64_t bytes_per_second, uint64_t burst = 0)
      : RateLimiter(bytes_per_second, burst, Clock()) {}
  RateLimiter(uint64_t bytes_per_second, uint64_t burst, Clock clock);

  uint64_t bytes_per_second() const { return rate_; }

  // Waits until `bytes` more may be sent.
  void Acquire(uint64_t bytes);

  // The bytes acquired so far.
  uint64_t acquired() const;

 private:
  const uint64_t rate_;
  const absl::Duration burst_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  // When the bytes acquired so far are paid for.
  absl::Time paid_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t acquired_ ABSL_GUARDED_BY(mu_) = 0;
};

// Acquires `bytes` from `limiter` unless it is null.
inline void AcquireSend(RateLimiter* limiter, uint64_t bytes) {
  if (limiter != nullptr) limiter->Acquire(bytes);
}

}  // namespace ckpt::io

#endif  // CKPT_IO_RATE_LIMITER_H_
