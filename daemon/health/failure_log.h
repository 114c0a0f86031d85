// FailureLog counts every failure of a job this node sees by its cause, and
// keeps a timeline of the last ones with the time the job took to recover
// (until its next save). Causes (kCauses): a trainer process that exited
// without closing its session (its signal or exit code when ckptd could
// read it), ckptd restarting under a job, a node of the job whose lease
// expired (health/node_watch.h), a persist that failed (the disk), a peer
// that a replica could not reach, replicas found to disagree (silent data
// corruption), an operator's rollback. Failures of one job before it saves
// again are one incident: the first one names it (a killed rank, then its peers
// stopped by the launcher).
//
// A failure that lasts (a disk that fails every persist, a node away) is one
// episode, counted once until it heals. The counts and the timeline survive
// ckptd's restarts through the history it hands to its persist callback.
//
// Metrics: ckpt_failures_total{job,cause}.
//
// Thread-safety: thread-safe. It calls into Metrics under its lock (Metrics
// never calls back); its callbacks run without its lock.
#ifndef CKPT_DAEMON_HEALTH_FAILURE_LOG_H_
#define CKPT_DAEMON_HEALTH_FAILURE_LOG_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/metrics.h"
#include "proto/catalog.pb.h"

namespace ckpt::daemon {

class FailureLog {
 public:
  static constexpr const char* kCauses[] = {
      "trainer_exited", "trainer_hung",     "daemon_restart",
      "node_lost",      "disk_error",       "peer_unreachable",
      "sdc_suspected",  "operator_rollback"};
  // Failures kept per job in the timeline.
  static constexpr size_t kKept = 32;

  // Called with a job's history after each change, to keep it.
  using Persist = std::function<void(const proto::FailureHistory&)>;
  // Called when an incident begins (the job stopped at `at`; `rank`: the
  // rank that failed, whose save ends it, or -1; `unseen`: how long before
  // `at` the job had surely stopped already).
  using OnIncident = std::function<void(const std::string& job, absl::Time at,
                                        int rank, absl::Duration unseen)>;

  // `metrics` must outlive this object.
  FailureLog(Metrics* metrics, Persist persist = nullptr,
             OnIncident on_incident = nullptr);
  FailureLog(const FailureLog&) = delete;
  FailureLog& operator=(const FailureLog&) = delete;

  // A failure of `job`. `incident`: it stops the job (a trainer exited,
  // ckptd restarted, a rollback), so that later ones before the job saves
  // again are part of it; a failed save that the job trains through (disk,
  // replicas) is not.
  // `rank`: the rank that failed, whose next save ends the incident (-1: the
  // next save of any rank). `since`: when the failed trainer's session
  // began; one that was there before the last incident and exits within
  // kLateExit of its recovery went down with it (noticed late: a launcher
  // restarting the job at once). `unseen`: how long the failure surely
  // went on before it was seen at `at` (a hang: its silence less one save
  // interval), handed to OnIncident.
  void Failed(const std::string& job, const std::string& cause,
              const std::string& detail, bool incident, absl::Time at,
              int rank = -1, absl::Time since = absl::InfiniteFuture(),
              absl::Duration unseen = absl::ZeroDuration())
      ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr absl::Duration kLateExit = absl::Seconds(10);
  // A failure of `cause` that lasts until Healed (every persist to a
  // failing disk, a node gone): counted once per episode. `node`: the node
  // it is of (node_lost, peer_unreachable), an episode of its own.
  void FailedEpisode(const std::string& job, const std::string& cause,
                     const std::string& detail, absl::Time at,
                     const std::string& node = "") ABSL_LOCKS_EXCLUDED(mu_);
  // The episode of `cause` (of `node`) is over (a persist succeeded, the
  // node is back): recovered at `at`. An empty `job`: every job's.
  void Healed(const std::string& job, const std::string& cause, absl::Time at,
              const std::string& node = "") ABSL_LOCKS_EXCLUDED(mu_);
  // ckptd restarted and found this history: counts, timeline and failing
  // episodes go on; an incident left open ended with the daemon.
  void Restore(const proto::FailureHistory& history) ABSL_LOCKS_EXCLUDED(mu_);
  // `rank` of the job began saving `step`: an open incident it ends is
  // recovered.
  void Saved(const std::string& job, uint64_t step, uint32_t rank,
             absl::Time at) ABSL_LOCKS_EXCLUDED(mu_);
  // The last kKept failures of `job` (every job's when empty), oldest first.
  std::vector<proto::FailureRecord> Timeline(const std::string& job) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    std::deque<proto::FailureRecord> timeline;
    bool open = false;  // the newest incident has not recovered yet
    int rank = -1;      // the rank whose save ends it (-1: any)
    uint64_t last_step = 0;
    std::map<std::string, uint64_t> counts;  // by cause
    std::set<std::string> failing;           // episodes not healed (EpisodeOf)
  };

  // Counts a failure and adds it to the timeline.
  proto::FailureRecord& Record(const std::string& job, Job& j,
                               const std::string& cause,
                               const std::string& detail, absl::Time at,
                               int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The name of an episode in Job::failing: its cause, and its node if any.
  static std::string EpisodeOf(const std::string& cause,
                               const std::string& node);
  // Ends `j`'s episode of `cause` and `node`, if it has one; false if not.
  static bool Heal(Job& j, const std::string& cause, const std::string& node,
                   absl::Time at);
  static proto::FailureHistory HistoryOf(const std::string& job, const Job& j);
  void Keep(const std::optional<proto::FailureHistory>& history);

  // A failure at `at` of a session begun `since` belongs to the newest
  // recovered incident of `j`.
  static bool PartOfLastIncident(const Job& j, absl::Time at, absl::Time since);

  Metrics* const metrics_;
  const Persist persist_;
  const OnIncident on_incident_;
  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
};

// How a trainer's session ended, from its process: empty when the process
// still runs (the Checkpointer went, not the trainer) or exited with 0;
// else "exited with code N", "killed by signal N", or "exited" when its
// status was reaped before ckptd could read it.
std::string TrainerExit(uint32_t pid);

// When process `pid` started (from /proc, to 10 ms); nullopt when it is not
// there to read (gone, or in another pid namespace).
std::optional<absl::Time> ProcessStart(uint32_t pid);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_HEALTH_FAILURE_LOG_H_
