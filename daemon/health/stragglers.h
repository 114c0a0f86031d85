// Stragglers flags the ranks that hold a job back: per committed step, how
// far each rank's shard arrived behind the step's first (its lag, from the
// step's check: health/replica_check.h), and which ranks keep arriving in
// the step's tail. A rank is in a step's tail when its lag is among the
// step's slowest tenth (at least the slowest rank), above twice the step's
// median lag and above kLagFloor (what scheduling noise alone does not
// reach); it is flagged while it was in the tail of kTailSteps of the job's
// last kWindow steps. Its mean lag and its step interval (between its own
// arrivals) are shown with it.
//
// It declares its metrics in the registry it is given: the lags
// (ckpt_save_lag_seconds), the ranks flagged (ckpt_stragglers,
// ckpt_straggler_lag_seconds{job,rank,node}: their mean lag, 0 once no
// longer flagged).
//
// Thread-safety: thread-safe. It calls into Metrics under its lock; Metrics
// never calls back.
#ifndef CKPT_DAEMON_HEALTH_STRAGGLERS_H_
#define CKPT_DAEMON_HEALTH_STRAGGLERS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/metrics.h"
#include "proto/catalog.pb.h"

namespace ckpt::daemon {

class Stragglers {
 public:
  static constexpr int kWindow = 5;
  static constexpr int kTailSteps = 4;
  static constexpr absl::Duration kLagFloor = absl::Milliseconds(50);

  // `metrics` must outlive this object.
  explicit Stragglers(Metrics* metrics);
  Stragglers(const Stragglers&) = delete;
  Stragglers& operator=(const Stragglers&) = delete;

  // A committed step's check, with its arrivals (steps may come in any
  // order, and more than once).
  void Saw(const proto::ReplicaCheck& check) ABSL_LOCKS_EXCLUDED(mu_);

  struct Flag {
    uint32_t rank = 0;
    std::string node;
    int tail_steps = 0;         // of the last kWindow
    double mean_lag_s = 0;      // over the last kWindow steps
    double interval_s = 0;      // between its arrivals, per step
    double job_interval_s = 0;  // the same, the job's median rank
  };
  std::vector<Flag> Flagged(const std::string& job) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Arrivals = std::vector<proto::RankArrival>;
  // The job's newest kWindow steps' arrivals.
  struct Job {
    std::map<uint64_t, Arrivals> steps;
    std::vector<Flag> flagged;
  };
  static std::set<uint32_t> Tail(const Arrivals& step);
  static std::vector<Flag> Judge(const Job& job);
  void Export(const std::string& job, const std::vector<Flag>& before,
              const std::vector<Flag>& now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Metrics* const metrics_;
  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_HEALTH_STRAGGLERS_H_
