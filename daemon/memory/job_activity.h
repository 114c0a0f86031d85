// JobActivity knows which jobs are in use on this node: how many trainer
// sessions each has open (libckpt holds an Attach call open for as long as a
// Checkpointer lives), when its last session closed and when it last saved.
// The memory tier uses it to tell idle jobs, whose copies give way first,
// from the jobs that are training. A job this daemon has not heard from since
// it started counts as idle since the start.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_MEMORY_JOB_ACTIVITY_H_
#define CKPT_DAEMON_MEMORY_JOB_ACTIVITY_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckpt::daemon {

class JobActivity {
 public:
  explicit JobActivity(absl::Time started = absl::Now()) : started_(started) {}

  struct Job {
    int sessions = 0;  // trainers attached now
    // Whether any trainer ever attached: then a job with none attached is
    // known to be idle; else (trainers of an older libckpt, or tools that
    // stage directly) only an old last save says so.
    bool ever_attached = false;
    // The last save began (BeginStage), and the last session closed; the
    // daemon's start for what it has not seen.
    absl::Time last_save;
    absl::Time detached;
    // When the job last did anything: now while a session is open.
    absl::Time LastActive(absl::Time now) const {
      return sessions > 0 ? now : std::max(last_save, detached);
    }
  };

  // A trainer session opened; Detach(job) when it closes.
  void Attach(const std::string& job);
  void Detach(const std::string& job);
  void Saved(const std::string& job, absl::Time when = absl::Now());
  Job Get(const std::string& job) const;
  std::map<std::string, Job> All() const;

 private:
  const absl::Time started_;
  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  Job& Find(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_MEMORY_JOB_ACTIVITY_H_
