#include "daemon/health/liveness.h"

#include "absl/strings/str_cat.h"
#include "daemon/common/describe.h"

namespace ckpt::daemon {

void Liveness::HousekeepingRound(absl::Time at) {
  absl::MutexLock lock(&mu_);
  housekept_ = at;
}

void Liveness::PersistProgressed(const SlotId& id, absl::Time at) {
  absl::MutexLock lock(&mu_);
  persisting_[id] = at;
}

void Liveness::PersistEnded(const SlotId& id) {
  absl::MutexLock lock(&mu_);
  persisting_.erase(id);
}

absl::Status Liveness::Check(absl::Duration stall, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  // A tight watchdog (WatchdogSec of a second) must not take one late tick
  // for a hang (CI saw a 0.5 s tick come after 503 ms).
  if (now - housekept_ > stall + 4 * tick_) {
    return absl::DeadlineExceededError(
        absl::StrCat("the housekeeping loop has not come round for ",
                     absl::FormatDuration(now - housekept_),
                     " (a lock held for that long, or a thread wedged)"));
  }
  for (const auto& [id, at] : persisting_) {
    if (now - at > stall) {
      return absl::DeadlineExceededError(
          absl::StrCat(Describe(id.job, id.step, id.rank),
                       ": its persist has not written a chunk for ",
                       absl::FormatDuration(now - at), " (the disk hangs?)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt::daemon
