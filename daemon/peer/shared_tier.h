// SharedTier is tier T3 (DESIGN.md §3): on a thread of its own it copies the
// shard files this node persisted to a shared file system (an NFS or Lustre
// mount, any POSIX path every node sees), for every step that is a multiple of
// `every`, and reports each copy once it is durable there: written under a
// temporary name, fsynced, renamed, its directory fsynced. The service then
// votes TIER_SHARED, so the step is committed at the tier when every rank's
// copy is there. A restore falls back to these copies when a shard is on no
// live node. Retention keeps the newest `keep` steps committed at the tier;
// copies of steps newer than the latest commit (being written) stay.
//
// Layout: <dir>/<job>/<step:020>-<rank:010>.ckpt
//
// A copy of an increment is the shard's own file when the tier holds its
// bases as the very files it names (their footers' manifest checksums),
// else its self-contained form. Each base it names gets a pin beside it,
// <base:020>-<rank:010>.ckpt.base-of-<step:020> (empty, durable before the
// copy is renamed into place): retention keeps a copy while a kept copy pins
// it, through chains, reading nothing but the directory's names; pins go
// with the copies that made them. Another save of a step replacing a pinned
// copy makes the copies that read it self-contained first (newest first),
// their pins removed.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_PEER_SHARED_TIER_H_
#define CKPT_DAEMON_PEER_SHARED_TIER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/common/metrics.h"
#include "io/file_system.h"
#include "proto/catalog.pb.h"
#include "snapshot/self_contained.h"

namespace ckpt::daemon {

struct SharedTierOptions {
  std::string dir;     // empty: no shared tier
  uint64_t every = 1;  // copy steps that are multiples of this
  int keep = 2;        // committed steps kept at the tier
};

class SharedTier {
 public:
  // Called on the copying thread once a shard's copy is durable.
  using OnCopied = std::function<void(const proto::ShardRecord& shard)>;

  static absl::StatusOr<std::unique_ptr<SharedTier>> Start(
      io::FileSystem* fs, SharedTierOptions options, Metrics* metrics,
      OnCopied on_copied);
  // Stops after the copy in progress; queued shards are not copied.
  ~SharedTier();

  bool Wants(uint64_t step) const { return step % options_.every == 0; }
  // A persisted shard (state PERSISTED, `shard_path` set) to copy.
  void Enqueue(const proto::ShardRecord& shard);
  // The shared copy of a shard as GetShard answers it (state PERSISTED,
  // `shard_path` in the shared directory); NotFound when there is none.
  absl::StatusOr<proto::ShardRecord> Find(const std::string& job, uint64_t step,
                                          uint32_t rank);
  bool Has(const std::string& job, uint64_t step, uint32_t rank);
  // Deletes the copies of `job` retention no longer keeps, given the job's
  // commit records.
  void CollectGarbage(const std::string& job,
                      const std::vector<proto::CommitRecord>& commits);

 private:
  SharedTier(io::FileSystem* fs, SharedTierOptions options, Metrics* metrics,
             OnCopied on_copied);
  std::string PathOf(const std::string& job, uint64_t step,
                     uint32_t rank) const;
  void Loop();
  absl::Status Copy(const proto::ShardRecord& shard);
  // What Copy writes: the shard's own file when it is an increment whose
  // bases are here as the very files it names (`bases` gets their steps),
  // else its self-contained form.
  absl::StatusOr<snapshot::SelfContained> Outgoing(
      const proto::ShardRecord& shard, std::vector<uint64_t>* bases);
  // Before `rank`'s copy of `step` is replaced by another save's: the copies
  // that read it (their pins name it, or one of those) made self-contained.
  absl::Status DetachDependents(const std::string& job, uint64_t step,
                                uint32_t rank);

  io::FileSystem* const fs_;
  const SharedTierOptions options_;
  Metrics* const metrics_;
  const OnCopied on_copied_;
  absl::Mutex mu_;
  std::deque<proto::ShardRecord> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_SHARED_TIER_H_
