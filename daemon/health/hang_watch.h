// HangWatch finds the trainers that hang: a rank whose session with ckptd is
// open but that has begun no save for a while — `after`, and ten of the
// job's save intervals — is stuck (a collective that never returns, a
// deadlock, a stopped process) while its process lives on, which no exit
// reveals. Each hang is reported once, until the rank saves again. ckptd's
// own pauses (a Check much later than the last one: it was stopped or
// starved) are not the trainers': every rank's clock starts over.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_HEALTH_HANG_WATCH_H_
#define CKPT_DAEMON_HEALTH_HANG_WATCH_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckpt::daemon {

class HangWatch {
 public:
  // Saves this many intervals apart at least before a rank is hung.
  static constexpr int kIntervals = 10;

  // `after`: the least silence that is a hang (InfiniteDuration: never).
  explicit HangWatch(absl::Duration after) : after_(after) {}
  HangWatch(const HangWatch&) = delete;
  HangWatch& operator=(const HangWatch&) = delete;

  void SessionBegun(const std::string& job, uint32_t rank, uint32_t pid,
                    absl::Time at) ABSL_LOCKS_EXCLUDED(mu_);
  void SessionEnded(const std::string& job, uint32_t rank, uint32_t pid)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The rank began saving `step`: it is in ckptd's hands until Done (a save
  // waiting for memory is no hang).
  void Saved(const std::string& job, uint32_t rank, uint64_t step,
             absl::Time at) ABSL_LOCKS_EXCLUDED(mu_);
  void Done(const std::string& job, uint32_t rank, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The rank asked ckptd something: it lives.
  void Alive(const std::string& job, uint32_t rank, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A trainer waits for `step` to commit (WaitCommitted names no rank): the
  // ranks that saved it wait for their peers, they do not hang, until
  // WaitEnded.
  void WaitBegun(const std::string& job, uint64_t step)
      ABSL_LOCKS_EXCLUDED(mu_);
  void WaitEnded(const std::string& job, uint64_t step, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);

  struct Hung {
    std::string job;
    uint32_t rank = 0;
    uint32_t pid = 0;
    absl::Duration silent;    // since its last save (or its session began)
    absl::Duration interval;  // the job's save interval, if known
  };
  // The ranks that became hung since the last call (called periodically).
  std::vector<Hung> Check(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Rank {
    std::multiset<uint32_t> pids;              // open sessions
    absl::Time active = absl::InfinitePast();  // its last save or session
    absl::Time last_save = absl::InfinitePast();
    uint64_t last_step = 0;
    int in_calls = 0;  // saves being begun
    bool hung = false;
  };
  struct Job {
    std::map<uint32_t, Rank> ranks;
    double interval_s = 0;           // moving average of a rank's save interval
    std::multiset<uint64_t> waited;  // steps trainers wait to see committed
  };

  const absl::Duration after_;
  absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_HEALTH_HANG_WATCH_H_
