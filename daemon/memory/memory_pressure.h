// Memory pressure: which memory-tier copies (staging slots of committed
// shards) give way when a save needs memory the budget does not have, as pure
// functions of the catalog, the commit records and the jobs' activity, so the
// rules can be tested apart from the daemon. The memory tier is a cache:
//  - a copy goes only when its shard is safe at a durable tier: persisted to
//    this node's disk (whether or not the other ranks' shards of its step
//    are: a restore of the step reads this rank from the file), or its step
//    committed and kept at the peer or shared tier, or its persist was
//    skipped for a newer save of its rank (--persist-newest); never a copy that
//    is being staged or persisted, the only copy of a shard whose persist
//    failed, or one a reader holds (a restore, ckpt verify: `pinned`);
//  - copies of idle jobs (no trainer attached, no recent save) go first,
//    least recently active job first, oldest step first; then the older
//    steps of active jobs, oldest first; then the newest steps of active
//    jobs, the saving job's own last. --keep-memory is a wish under pressure,
//    not a reservation;
//  - nothing goes unless what can go covers the need: a save that cannot be
//    helped does not cost other jobs their copies.
//
// Thread-safety: pure functions, callable from any thread.
#ifndef CKPT_DAEMON_MEMORY_MEMORY_PRESSURE_H_
#define CKPT_DAEMON_MEMORY_MEMORY_PRESSURE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/memory/job_activity.h"
#include "proto/catalog.pb.h"

namespace ckpt::daemon {

// Why a memory-tier copy went (the label of ckpt_memory_evictions_total).
enum class EvictionReason {
  kIdleJob,     // pressure: a job with no trainer attached and no recent save
  kOlderStep,   // pressure: a step of an active job older than its newest
  kNewestStep,  // pressure: an active job's newest step in memory
  kIdleTtl,     // its job was idle longer than --idle-job-memory-ttl
  kOperator,    // ckpt gc JOB --memory
};
absl::string_view ReasonName(EvictionReason reason);

// Why the memory-tier copy of `shard` must stay; empty when the shard is
// safe at a durable tier: persisted to this node's disk, or its step
// committed and kept at the peer or shared tier (`kept_elsewhere`).
std::string WhyKept(const proto::ShardRecord& shard,
                    const std::set<uint64_t>& kept_elsewhere);

struct MemoryCopy {
  proto::ShardRecord shard;  // has a slot_path
  std::string kept;          // WhyKept: empty when it may go
};

struct Eviction {
  proto::ShardRecord shard;
  EvictionReason reason;
};

struct PressureInput {
  std::vector<MemoryCopy> copies;  // every job's
  std::map<std::string, JobActivity::Job> jobs;
  std::string saving_job;  // its own copies go last
  absl::Time now;
  // A job none of whose trainers ever attached (an older libckpt) is active
  // while it saved this recently; one whose trainers all detached is idle.
  absl::Duration recent = absl::Minutes(1);
  // Whether a reader holds the copy's slot; asked only of copies chosen.
  std::function<bool(const proto::ShardRecord&)> pinned;
};

// Copies to evict, in the order above, until their slots cover `needed`
// bytes; empty when every copy that may go does not cover it.
std::vector<Eviction> PlanEviction(const PressureInput& in, uint64_t needed);

// Whether `job` counts as idle now (see PressureInput::recent).
bool IsIdle(const JobActivity::Job& job, absl::Time now, absl::Duration recent);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_MEMORY_MEMORY_PRESSURE_H_
