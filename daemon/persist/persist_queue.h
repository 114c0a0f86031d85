// PersistQueue orders the work of ckptd's persist threads: staged shards to
// write to local disk, and garbage collection asked for per job.
//
// - Each rank persists in step order: while one of a rank's shards is being
//   persisted its later shards wait, and other ranks' go ahead.
// - Persisting comes before garbage collection; a finished persist asks for
//   a collection of its job (the step it made safe may free older copies).
// - A shard saved again before it was persisted is withdrawn from the queue
//   (Withdraw), waiting out a persist of it in flight.
// - Newest only (Add's `newest_only`): a rank's newer shard takes the place
//   of its older ones still waiting (not one in flight), when saves come
//   faster than the disk takes them.
//
// The caller does the work: Next hands out one piece, Done or GcDone
// reports it finished. Nothing here touches the disk.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_PERSIST_PERSIST_QUEUE_H_
#define CKPT_DAEMON_PERSIST_PERSIST_QUEUE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/slot_id.h"

namespace ckpt::daemon {

class PersistQueue {
 public:
  // One piece of work: a shard to persist (then Done), or, when `shard` is
  // empty, the garbage of job `gc_job` to collect (then GcDone).
  struct Work {
    std::optional<SlotId> shard;
    std::string gc_job;
  };

  // Queues a staged shard behind those queued before it. With
  // `newest_only`, the same rank's older shards still waiting leave the
  // queue: returned, they will not be persisted.
  std::vector<SlotId> Add(const SlotId& id, bool newest_only = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Asks for a collection of `job` (once, however often asked before one of
  // the threads takes it).
  void RequestGc(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until there is work or Stop was called (then nullopt). The shard
  // handed out counts as being persisted until Done.
  std::optional<Work> Next() ABSL_LOCKS_EXCLUDED(mu_);
  // The shard Next handed out is done with (persisted or failed): its rank's
  // next shard may go, and its job's garbage is collected.
  void Done(const SlotId& id) ABSL_LOCKS_EXCLUDED(mu_);
  // The collection Next handed out is over.
  void GcDone() ABSL_LOCKS_EXCLUDED(mu_);
  // Takes `id` out of the queue and waits until no persist of it is in
  // flight. Returns whether it was queued.
  bool Withdraw(const SlotId& id) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether a shard is being persisted now.
  bool Persisting() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until nothing is queued, persisted or collected.
  void WaitIdle() const ABSL_LOCKS_EXCLUDED(mu_);
  // Next returns nullopt from now on; queued work stays undone.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `timeout` for Stop; returns whether it came.
  bool WaitForStop(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The first queued shard whose rank has none being persisted.
  std::deque<SlotId>::iterator FirstReady() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::deque<SlotId> queue_ ABSL_GUARDED_BY(mu_);
  // (job, rank) -> the step of it being persisted.
  std::map<std::pair<std::string, uint32_t>, uint64_t> busy_
      ABSL_GUARDED_BY(mu_);
  std::set<std::string> gc_wanted_ ABSL_GUARDED_BY(mu_);
  int gc_running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PERSIST_PERSIST_QUEUE_H_
