// ChangeCounter lets a waiter sleep until something it may care about
// changed: every change bumps the counter, and a waiter that read it before
// looking wakes when it moved on (or at its deadline). WaitCommitted uses it
// to look at the coordinator again only after a vote, a persist or a
// rollback on this node — or every 100 ms for other nodes' votes.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_COMMON_CHANGE_COUNTER_H_
#define CKPT_DAEMON_COMMON_CHANGE_COUNTER_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckpt::daemon {

class ChangeCounter {
 public:
  uint64_t Current() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return count_;
  }
  void Bump() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  // Waits until the count is no longer `seen` or `deadline` passes; returns
  // whether it changed.
  bool AwaitChange(uint64_t seen, absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return count_ != seen;
    };
    return mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  }

 private:
  mutable absl::Mutex mu_;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_COMMON_CHANGE_COUNTER_H_
