// ReplicaAudit runs the comparison of replicas (health/replica_check.h) for
// this node: it posts each shard's digests through the coordinator, and once
// a step is committed somewhere and every rank's digests are in, compares
// them and keeps the verdict (the first node to keep one decides for all). A
// suspect step is logged with the ranks and nodes outside the majority and
// counted (ckpt_sdc_suspect_steps_total, ckpt_sdc_suspect_shards_total);
// Coordinator::LatestTrusted then skips it as a resume step.
//
// Its errors are logged, never returned: a step whose replicas could not be
// compared stays trusted, as it was before the check existed.
//
// Thread-safety: thread-safe. Calls into the coordinator and Metrics outside
// its lock.
#ifndef CKPT_DAEMON_HEALTH_REPLICA_AUDIT_H_
#define CKPT_DAEMON_HEALTH_REPLICA_AUDIT_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/common/metrics.h"
#include "daemon/coord/coordinator.h"
#include "proto/catalog.pb.h"

namespace ckpt::daemon {

class ReplicaAudit {
 public:
  // Each verdict this node keeps or reads, once per step it asks about;
  // `kept_here`: this node made it.
  using VerdictCallback =
      std::function<void(const proto::ReplicaCheck&, bool kept_here)>;
  // `coordinator` and `metrics` must outlive this object. `node` names this
  // node in the digests it posts.
  ReplicaAudit(Coordinator* coordinator, Metrics* metrics, std::string node,
               VerdictCallback on_verdict = nullptr);
  ReplicaAudit(const ReplicaAudit&) = delete;
  ReplicaAudit& operator=(const ReplicaAudit&) = delete;

  // A staged shard: its digests are posted when its trainer hashed every
  // tensor (true); else the persist posts them (false).
  bool PostStaged(const proto::ShardRecord& shard);
  // `shard` was persisted as `manifest`: its digests are posted unless its
  // staging posted them.
  void PostPersisted(const proto::ShardRecord& shard,
                     const proto::ShardManifest& manifest);
  // `step` is committed at some tier: compares its replicas if this node
  // knows of no verdict yet and every rank's digests are in.
  void StepCommitted(const std::string& job, uint64_t step)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Post(const std::string& job, uint64_t step,
            const proto::ReplicaDigests& digests);
  // The verdict was kept by this node: what it tells, told.
  void Report(const proto::ReplicaCheck& check);

  Coordinator* const coordinator_;
  Metrics* const metrics_;
  const std::string node_;
  const VerdictCallback on_verdict_;
  absl::Mutex mu_;
  // Steps with a verdict, newest kept (kSettledKept).
  std::set<std::pair<std::string, uint64_t>> settled_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kSettledKept = 4096;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_HEALTH_REPLICA_AUDIT_H_
