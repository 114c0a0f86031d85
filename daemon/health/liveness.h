// Liveness tells a watchdog whether ckptd is making progress: its
// housekeeping loop reports each round, and each persist in flight reports
// each chunk it writes. Check names what has not moved for too long — a lock
// held, a thread wedged, a disk that hangs — so that systemd's watchdog
// restarts a daemon that is stuck rather than one that is busy.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_HEALTH_LIVENESS_H_
#define CKPT_DAEMON_HEALTH_LIVENESS_H_

#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/slot_id.h"

namespace ckpt::daemon {

class Liveness {
 public:
  // Housekeeping comes round every `tick` when idle.
  explicit Liveness(absl::Duration tick) : tick_(tick) {}

  void HousekeepingRound(absl::Time at) ABSL_LOCKS_EXCLUDED(mu_);
  // A persist of `id` began or wrote a chunk.
  void PersistProgressed(const SlotId& id, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);
  void PersistEnded(const SlotId& id) ABSL_LOCKS_EXCLUDED(mu_);

  // DeadlineExceeded naming what is stuck when housekeeping has not come
  // round for `stall` plus four ticks, or a persist in flight has not
  // written a chunk for longer than `stall`.
  absl::Status Check(absl::Duration stall, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const absl::Duration tick_;
  mutable absl::Mutex mu_;
  absl::Time housekept_ ABSL_GUARDED_BY(mu_) = absl::Now();
  std::map<SlotId, absl::Time> persisting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_HEALTH_LIVENESS_H_
