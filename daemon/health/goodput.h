// Goodput splits each job's wall time, as this node sees it, into four
// parts that add up to it:
//   training   the trainers computed (what remains),
//   stall      a local rank was copying its state into its slot (a save's
//              cost to the trainer; overlapping ranks count once),
//   recovery   from a failure that stopped the job (FailureLog's incidents)
//              until it trains again: its ranks' last restore with resume,
//              else its first save; and a trainer's start-up (its launch to
//              its session) when the job starts,
//   lost       training time whose result was thrown away: from the save of
//              the step the job resumed from to the failure (moved there
//              from training when the job resumes).
// ETTR (effective training time ratio) = training / wall time. The clock runs
// while a trainer's session is open or a recovery is under way, and stops
// when the job's last session ends cleanly. The split survives ckptd's
// restarts through the record it hands to its persist callback; the time the
// daemon was down counts as recovery.
//
// Metrics: ckpt_goodput_seconds{job,kind}, ckpt_ettr{job}.
//
// Thread-safety: thread-safe. It calls Metrics and the persist callback
// without its lock held.
#ifndef CKPT_DAEMON_HEALTH_GOODPUT_H_
#define CKPT_DAEMON_HEALTH_GOODPUT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/metrics.h"
#include "proto/catalog.pb.h"

namespace ckpt::daemon {

class Goodput {
 public:
  using Persist = std::function<void(const proto::GoodputRecord&)>;
  // Steps whose training time is kept, per job, to measure lost work (then
  // every other one is dropped).
  static constexpr size_t kStepsKept = 256;
  // A running job's record is handed to `persist` at most this often (and at
  // every failure, resume and stop).
  static constexpr absl::Duration kPersistEvery = absl::Milliseconds(100);

  // `metrics` must outlive this object; its scrapes read it.
  Goodput(Metrics* metrics, Persist persist);
  Goodput(const Goodput&) = delete;
  Goodput& operator=(const Goodput&) = delete;

  // ckptd restarted and found this record: its split goes on from there.
  // The time since the record's mark counts as recovery if the job was
  // running then (the daemon went down under it).
  void Restore(const proto::GoodputRecord& record, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `job` was running when the record Restore found was kept
  // (nullopt: none was found).
  std::optional<bool> WasRunning(const std::string& job) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // A trainer's session with the job opened (its process `launched` then:
  // the job's clock, if stopped, starts there, and the trainer's start-up
  // until `at` counts as recovery), or ended (an unclean end comes with a
  // failure first).
  void SessionBegun(const std::string& job, uint32_t pid, absl::Time at,
                    absl::Time launched) ABSL_LOCKS_EXCLUDED(mu_);
  // `clean`: the trainer said so (EndSession; its session may have been
  // with an earlier ckptd, and not be open here). When no session is left
  // open the clock stops if the end was clean, even in a recovery (the
  // trainers ran until then).
  void SessionEnded(const std::string& job, uint32_t pid, absl::Time at,
                    bool clean) ABSL_LOCKS_EXCLUDED(mu_);
  // A local rank began and ended copying its shard of `step` (a copy it
  // abandoned ends when it begins the next).
  void StagingBegun(const std::string& job, uint64_t step, uint32_t rank,
                    absl::Time at) ABSL_LOCKS_EXCLUDED(mu_);
  void Staged(const std::string& job, uint32_t rank, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A failure stopped the job (an incident): recovery from `at` until
  // `rank` (-1: any rank) begins a save. `unseen`: the job had stopped that
  // long before `at` (a hang seen after its silence): that time, counted
  // as training until now, is recovery too.
  void Failed(const std::string& job, absl::Time at, int rank = -1,
              absl::Duration unseen = absl::ZeroDuration())
      ABSL_LOCKS_EXCLUDED(mu_);
  // A rank restored `step` and resumes training from it.
  void Resumed(const std::string& job, uint64_t step, absl::Time at)
      ABSL_LOCKS_EXCLUDED(mu_);

  struct Split {
    double training = 0, stall = 0, recovery = 0, lost = 0;
    double wall() const { return training + stall + recovery + lost; }
    double ettr() const { return wall() > 0 ? training / wall() : 0; }
  };
  // The split of `job` up to `now`.
  Split Of(const std::string& job, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    proto::GoodputRecord record;
    std::multiset<uint32_t> sessions;        // the trainers' pids
    std::map<uint32_t, absl::Time> staging;  // rank -> since
    absl::Time resumed_at = absl::InfinitePast();
    uint64_t resumed_step = UINT64_MAX;
    int failed_rank = -1;  // whose save ends the recovery (-1: any)
    absl::Time persisted = absl::InfinitePast();
    std::optional<bool> was_running;  // in the record ckptd restarted with
  };

  // Accounts the time from the record's mark to `at` to the part the job is
  // in, then moves the mark.
  static void Advance(Job& j, absl::Time at);
  static Split SplitOf(const proto::GoodputRecord& r);
  // The job trains again at `at`: the recovery ends (at the last resume if
  // one came) and the work since the resumed step's save is lost.
  static void EndRecovery(Job& j, absl::Time at);
  // The record to persist now, if due (`force`: a state change).
  std::optional<proto::GoodputRecord> Due(Job& j, absl::Time at, bool force);
  void Publish(const std::optional<proto::GoodputRecord>& record);
  void Scrape(Metrics& m) ABSL_LOCKS_EXCLUDED(mu_);

  Metrics* const metrics_;
  const Persist persist_;
  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_HEALTH_GOODPUT_H_
