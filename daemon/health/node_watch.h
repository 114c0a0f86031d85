// NodeWatch counts the nodes a job lost. A node whose membership ended
// without it stopping (its etcd lease expired: crashed and not back within
// the TTL, stopped or cut off past it) while trainers of a job ran there is a
// node_lost failure of that job: counted once in the cluster, by the first
// node to claim the departure (Coordinator::ClaimDeparture; a ckptd that
// stops cleanly claims its own), as an episode that heals when the node
// joins again (the time it was away). For the others to know what it served,
// it keeps this node's jobs (those with a trainer session open) in its
// membership record.
//
// Thread-safety: thread-safe; its thread calls the coordinator, the job
// lister and the FailureLog, without locks of its own held.
#ifndef CKPT_DAEMON_HEALTH_NODE_WATCH_H_
#define CKPT_DAEMON_HEALTH_NODE_WATCH_H_

#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/coord/coordinator.h"
#include "daemon/health/failure_log.h"

namespace ckpt::daemon {

class NodeWatch {
 public:
  // The jobs whose trainers this node serves now.
  using ServedJobs = std::function<std::vector<std::string>()>;
  // How often the served jobs are looked at (and the longest a change of
  // membership waits to be seen while they are).
  static constexpr absl::Duration kRound = absl::Milliseconds(500);

  // Starts watching for `node`; `coordinator` and `failures` must outlive
  // it. A coordinator of one node (embedded) has nobody to watch: the
  // thread ends at once.
  NodeWatch(Coordinator* coordinator, std::string node, FailureLog* failures,
            ServedJobs served);
  NodeWatch(const NodeWatch&) = delete;
  NodeWatch& operator=(const NodeWatch&) = delete;
  ~NodeWatch();

 private:
  void Loop();
  // The nodes here now were not lost: their episodes, if any, heal.
  void HealLiveNodes();
  // Keeps the served jobs in the membership record when they changed.
  void KeepServedJobs();
  // `change`: a node left at `at`; counted if this node claims it first.
  void Left(const Coordinator::MemberChange& change, absl::Time at);
  bool Stopping() ABSL_LOCKS_EXCLUDED(mu_);

  Coordinator* const coordinator_;
  const std::string node_;
  FailureLog* const failures_;
  const ServedJobs served_;
  // The loop's own: the jobs last kept, and when keeping them last failed.
  std::optional<std::vector<std::string>> kept_;
  absl::Time keep_warned_ = absl::InfinitePast();
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_HEALTH_NODE_WATCH_H_
