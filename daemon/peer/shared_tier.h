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
// On an object store (s3://bucket/prefix, peer/shared_store.h) a copy is
// written straight to its key, where it appears whole once its upload
// completes (an upload a crash left is aborted before the shard is copied
// again), and a restore reads it landed in this node's memory tier, whole
// or range by range as the restore reads it (peer/landed_copies.h).
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
#include "absl/types/optional.h"
#include "daemon/common/metrics.h"
#include "daemon/peer/landed_copies.h"
#include "daemon/peer/shared_store.h"
#include "io/file_system.h"
#include "proto/catalog.pb.h"
#include "snapshot/self_contained.h"

namespace ckpt::daemon {

struct SharedTierOptions {
  // A directory every node mounts, or s3://bucket/prefix; empty: no shared
  // tier.
  std::string dir;
  uint64_t every = 1;               // copy steps that are multiples of this
  int keep = 2;                     // committed steps kept at the tier
  ObjectStoreOptions object_store;  // for an s3:// dir
  // With an object store: where restores land the copies they read (a
  // directory of this node's memory tier, peer/landed_copies.h), and how
  // many bytes of them it holds at most.
  std::string landing_dir;
  uint64_t landing_budget_bytes = uint64_t{4} << 30;
  // How long a copy is tried again while the store does not answer (down,
  // restarting, unreachable); other failures are tried five times.
  absl::Duration retry_for = absl::Minutes(15);
};

class SharedTier {
 public:
  // Called on the copying thread once a shard's copy is durable.
  using OnCopied = std::function<void(const proto::ShardRecord& shard)>;

  // `local` holds this node's shard files (and the landed copies).
  static absl::StatusOr<std::unique_ptr<SharedTier>> Start(
      io::FileSystem* local, SharedTierOptions options, Metrics* metrics,
      OnCopied on_copied);
  // Stops after the copy in progress; queued shards are not copied.
  ~SharedTier();

  bool Wants(uint64_t step) const { return step % options_.every == 0; }
  // A persisted shard (state PERSISTED, `shard_path` set) to copy.
  void Enqueue(const proto::ShardRecord& shard);
  // The shared copy of a shard as GetShard answers it (state PERSISTED,
  // `shard_path` in the shared directory, or a copy landed from the object
  // store); NotFound when there is none. `on_demand`: a copy from an object
  // store lands only its footer and manifest now (`lands_on_demand` set), the
  // rest as the reader asks for it (LandRange).
  absl::StatusOr<proto::ShardRecord> Find(const std::string& job, uint64_t step,
                                          uint32_t rank,
                                          bool on_demand = false);
  // Lands bytes [offset, offset + length) of the copy Find landed at `local`
  // on demand (LandedCopies::LandRange).
  absl::Status LandRange(const std::string& local, const std::string& job,
                         uint64_t step, uint32_t rank, uint64_t offset,
                         uint64_t length);
  bool Has(const std::string& job, uint64_t step, uint32_t rank);
  // Writes the step's commit marker, <dir>/<job>/<step:020>.commit (the
  // commit record, serialized), once the step is committed at the tier:
  // what reads the tier alone (a new cluster's `ckpt ls s3://...`) counts as
  // committed. Any node may write it, any number of times.
  absl::Status MarkCommitted(const proto::CommitRecord& commit);
  // The commit records the tier's markers hold for `job`: every step's, or
  // `step`'s only (none: an empty vector).
  absl::StatusOr<std::vector<proto::CommitRecord>> Markers(
      const std::string& job, absl::optional<uint64_t> step = absl::nullopt);
  // Deletes the copies of `job` retention no longer keeps, given the job's
  // commit records: the markers of the steps it keeps written first if
  // missing, those of the steps it drops deleted before their copies.
  void CollectGarbage(const std::string& job,
                      const std::vector<proto::CommitRecord>& commits);

 private:
  SharedTier(io::FileSystem* local, SharedStore store,
             SharedTierOptions options, Metrics* metrics, OnCopied on_copied);
  std::string PathOf(const std::string& job, uint64_t step,
                     uint32_t rank) const;
  void Loop();
  absl::Status Copy(const proto::ShardRecord& shard);
  // Copy, tried again as `retry_for` and kAttempts say; Cancelled when the
  // tier stops meanwhile.
  absl::Status CopyWithRetries(const proto::ShardRecord& shard,
                               const std::string& what);
  // Whether `copied` failed because the shard's local file is gone.
  bool LocalGone(const proto::ShardRecord& shard, const absl::Status& copied);
  // What Copy writes: the shard's own file when it is an increment whose
  // bases are here as the very files it names (`bases` gets their steps),
  // else its self-contained form.
  absl::StatusOr<snapshot::SelfContained> Outgoing(
      const proto::ShardRecord& shard, std::vector<uint64_t>* bases);
  // Before `rank`'s copy of `step` is replaced by another save's: the copies
  // that read it (their pins name it, or one of those) made self-contained.
  absl::Status DetachDependents(const std::string& job, uint64_t step,
                                uint32_t rank);
  // DetachDependents when the copy at `path` is another save's than `view`.
  absl::Status DetachIfReplaced(const proto::ShardRecord& shard,
                                const snapshot::SelfContained& view,
                                const std::string& path);
  // On an object store: aborts the uploads of `path` begun and never
  // completed (by this node before a crash: only it copies its shards).
  absl::Status AbortLeftUploads(const std::string& path);

  io::FileSystem* const local_;
  const SharedStore store_;
  io::FileSystem* const fs_;              // store_.fs: where the copies are
  std::unique_ptr<LandedCopies> landed_;  // with an object store
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
