// JobHealth is what ckptd sees of each job's rhythm and failures, from the
// saves and commits that pass through it: how long trainers take to stage a
// shard (what a save costs them), the interval between saves, the commit
// latency per tier and the age of the last commit, the failures it noticed
// (a job restarting from an earlier step, ckptd restarting under a job) and
// how long each took to recover. From those it derives the Young/Daly save
// interval sqrt(2 * cost * MTBF).
//
// It declares its metrics in the registry it is given and keeps the gauges
// current at every scrape (docs/daemon.md lists them).
//
// Thread-safety: thread-safe. It calls into Metrics under its lock; Metrics
// never calls back except in a scrape, which takes the lock itself.
#ifndef CKPT_DAEMON_HEALTH_JOB_HEALTH_H_
#define CKPT_DAEMON_HEALTH_JOB_HEALTH_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/metrics.h"
#include "daemon/common/slot_id.h"
#include "proto/daemon.pb.h"

namespace ckpt::daemon {

class JobHealth {
 public:
  // `metrics` must outlive this object; its scrapes read it.
  explicit JobHealth(Metrics* metrics);
  JobHealth(const JobHealth&) = delete;
  JobHealth& operator=(const JobHealth&) = delete;

  // A rank began staging a shard.
  void StagingBegun(const SlotId& id, absl::Time at) ABSL_LOCKS_EXCLUDED(mu_);
  // The shard is staged: its staging time counts. Returns the earlier steps
  // of the same rank whose staging began and never completed: a trainer
  // stages in step order, so those were abandoned (forgotten here).
  std::vector<uint64_t> Staged(const SlotId& id, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Rank 0 began saving `step`: the save interval; a step not newer than the
  // job's last is a job restart, whose recovery took since that last save.
  // The first save after a daemon restart ends that recovery.
  void SawSave(const std::string& job, uint64_t step, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `step` was committed at `tiers`: latency since its first staging, and
  // the last committed step per tier (which never goes back).
  void Committed(const std::string& job, uint64_t step,
                 const std::vector<proto::Tier>& tiers, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);
  // ckptd started and found the job's shards: it went down under the job.
  // `last_save`: when its newest shard was staged (InfinitePast: unknown).
  void DaemonRestarted(const std::string& job, absl::Time last_save,
                       absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // The job was rolled back to `step`: its next save is not a restart.
  void RolledBackTo(const std::string& job, uint64_t step)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The figures the gauges show, for one job (tests, ckpt status).
  struct Figures {
    absl::Time since = absl::InfinitePast();      // first seen (or restart)
    absl::Time last_save = absl::InfinitePast();  // rank 0's last save
    uint64_t last_step = 0;
    double interval = 0;  // moving average of the save interval, seconds
    int intervals = 0;
    double staging_seconds = 0;
    uint64_t stagings = 0;
    int failures = 0;
    // After a daemon restart: the last save it knew of, until the job's
    // first save measures the recovery.
    absl::Time down_since = absl::InfinitePast();
  };
  Figures Of(const std::string& job) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void DeclareMetrics();
  void Scrape(Metrics& m) ABSL_LOCKS_EXCLUDED(mu_);

  Metrics* const metrics_;
  mutable absl::Mutex mu_;
  std::map<std::string, Figures> jobs_ ABSL_GUARDED_BY(mu_);
  // When each shard's staging began, and each step's first staging.
  std::map<std::tuple<std::string, uint64_t, uint32_t>, absl::Time> begun_
      ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, uint64_t>, absl::Time> first_begun_
      ABSL_GUARDED_BY(mu_);
  // (job, tier) -> its newest commit's step and time.
  std::map<std::pair<std::string, proto::Tier>, std::pair<uint64_t, absl::Time>>
      last_commit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_HEALTH_JOB_HEALTH_H_
