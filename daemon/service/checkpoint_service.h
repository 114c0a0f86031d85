// CheckpointService is ckptd's core on one node, independent of the transport
// that exposes it (the gRPC local API wraps it): trainers stage shards into
// memory-tier slots, the service persists staged shards to local disk through
// the snapshot pipeline (in step order per rank, on a pool of persist threads),
// votes each tier reached to the coordinator, applies retention, and, when it
// starts after a crash, adopts the staged slots it finds and finishes
// persisting them, deleting only what was never staged completely.
//
// Life of a shard (catalog state):  BeginStage -> STAGING -> StageComplete ->
// STAGED (vote memory) -> persisted -> PERSISTED (vote local_disk) | FAILED
// (the error is reported to WaitCommitted and kept in the catalog).
//
// The service wires objects that own their state: the PersistQueue orders
// the persist threads' work, IncrementalBases the bases of incremental saves,
// JobHealth the jobs' figures, Liveness what the watchdog checks; the arena,
// catalog, coordinator and the peer tiers below. Its code: checkpoint_service
// .cc (start and staging), _recovery.cc (start-up recovery), _commits.cc
// (voting and commit, trainers' restores, queries), _persist.cc (the persist
// pipeline), _bases.cc (which base a save builds on), _retention.cc
// (retention and ApplyDrops), _memory.cc (the memory tier as a cache),
// _peers.cc (the peer tier), _steps.cc (copy and rollback of committed
// steps), _metrics.cc.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_SERVICE_CHECKPOINT_SERVICE_H_
#define CKPT_DAEMON_SERVICE_CHECKPOINT_SERVICE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/catalog/catalog.h"
#include "daemon/catalog/kv_store.h"
#include "daemon/common/change_counter.h"
#include "daemon/common/metrics.h"
#include "daemon/coord/embedded_coordinator.h"
#include "daemon/health/failure_log.h"
#include "daemon/health/goodput.h"
#include "daemon/health/hang_watch.h"
#include "daemon/health/job_health.h"
#include "daemon/health/liveness.h"
#include "daemon/health/node_watch.h"
#include "daemon/health/replica_audit.h"
#include "daemon/health/stragglers.h"
#include "daemon/memory/job_activity.h"
#include "daemon/memory/memory_pressure.h"
#include "daemon/memory/staging_arena.h"
#include "daemon/peer/parity_tier.h"
#include "daemon/peer/replicator.h"
#include "daemon/peer/shared_tier.h"
#include "daemon/persist/file_recycler.h"
#include "daemon/persist/incremental_bases.h"
#include "daemon/persist/persist_queue.h"
#include "daemon/persist/retention.h"
#include "daemon/publish/publisher.h"
#include "daemon/publish/subscriptions.h"
#include "io/file_system.h"
#include "proto/daemon.pb.h"
#include "snapshot/shard_writer.h"

namespace ckpt::daemon {

struct ServiceOptions {
  // Holds the catalog (catalog/) and the persisted shards (shards/<job>/).
  std::string data_dir;
  StagingOptions staging;
  int persist_threads = 2;
  snapshot::ShardWriterOptions writer;
  // Committed steps kept on local disk and in memory. The latest committed step
  // is never deleted, and the one before it stays until a newer one is
  // committed at the same tier.
  int keep_disk_steps = 2;
  int keep_memory_steps = 1;
  // A rank's newer shard takes the place of its older ones still waiting to
  // be persisted (PersistQueue's newest only): saves that come faster than
  // the disk do not queue up behind it. The skipped ones stay committed in
  // memory (persist_skipped), never on disk; waiting for their disk commit
  // fails at once.
  bool persist_newest = false;
  // Shard files retired by garbage collection that are kept (in
  // <data_dir>/recycle/) for the next persists to write over; 0 deletes them
  // at once. See FileRecycler.
  int recycle_files = 2;
  // The coordination backend (etcd for many nodes); null: the embedded one,
  // in this daemon's catalog.
  std::shared_ptr<Coordinator> coordinator;
  // Peer replication (tier T1) and restores from peers: on when
  // `replication.dir` is set (ckptd's --peer-address).
  ReplicationOptions replication;
  // The erasure-coded peer tier (--peer-redundancy rs:K+M) instead of K full
  // replicas: on when parity.k > 0; needs `replication` (its dir holds the
  // parity blocks under parity/, its peers carry them).
  ParityOptions parity;
  // The shared tier (T3): on when `shared.dir` is set.
  SharedTierOptions shared;
  // Publication of committed steps to readers (issue #37): on when
  // `publish.dir` is set (ckptd: <staging-dir>.publish by default).
  PublishOptions publish;
  // Topics this node subscribes to (--subscribe): each new version is
  // fetched from the peers (needs `replication`, the peer tier) and
  // publication on.
  std::vector<std::string> subscribe;
  SubscriptionOptions subscription;
  // A job with no trainer attached for this long gives up its memory-tier
  // copies once they are safe at a durable tier; InfiniteDuration: never.
  absl::Duration idle_job_memory_ttl = absl::Minutes(10);
  // A rank whose session is open but that began no save for this long (and
  // for ten of the job's save intervals) hangs: a trainer_hung failure
  // (health/hang_watch.h). InfiniteDuration: never.
  absl::Duration trainer_hung_after = absl::Minutes(10);
  // Incremental saves: a rank's shard stores only the chunks that changed
  // since its previous persisted shard (the rest stay where that one stores
  // them), and every `full_every`-th save of a rank stores every chunk; 1:
  // every save is full. Copies that leave the node are self-contained. Only
  // with the embedded coordinator (see PinBase).
  int full_every = 10;
  // ckptd's default when it is given no --cluster-key: at start, the
  // cluster's key for sealing manifests is made or read through the
  // coordinator (Coordinator::AgreeClusterKey) and installed for the whole
  // process (snapshot::InstallSealKeys). False: the process's keys are left
  // as they are (a --cluster-key file, or none).
  bool agree_cluster_key = false;
  // Names this node in the key's record and in the departures of other
  // nodes it claims (health/node_watch.h).
  std::string node_id;
};

class CheckpointService {
 public:
  // Opens the catalog, recovers from a previous run and starts the persist
  // threads. `fs` is where shards are persisted (tests pass a
  // FaultInjectionFs); it must outlive the service.
  static absl::StatusOr<std::unique_ptr<CheckpointService>> Start(
      io::FileSystem* fs, ServiceOptions options);
  // Stops after the shard being persisted by each thread; queued shards stay
  // STAGED and are persisted by the next start.
  ~CheckpointService();

  // Reserves and creates the staging slot for one rank's shard of a step.
  // When the memory budget is full, garbage collection runs at once and the
  // policy applies, waiting no later than `deadline` (the caller's).
  absl::StatusOr<SlotInfo> BeginStage(
      const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
      uint64_t bytes, absl::Time deadline = absl::InfiniteFuture());
  // The trainer filled the slot: from now on the daemon owns it. `items` say
  // where each tensor and byte item lies in the slot; they are validated
  // against the slot before anything else.
  absl::Status StageComplete(const std::string& job, uint64_t step,
                             uint32_t rank,
                             const std::vector<proto::StagedItem>& items);
  // Gives up a slot that was never completed (the trainer failed to fill it).
  absl::Status AbortStage(const std::string& job, uint64_t step, uint32_t rank);
  // A peer's offer of a shard this node has no copy of, for the client to
  // stream straight into its memory (Replicator::OfferFromPeers);
  // FailedPrecondition when this node has a copy, or no peer service.
  absl::StatusOr<proto::PeerShardOffer> OfferPeerShard(const std::string& job,
                                                       uint64_t step,
                                                       uint32_t rank);

  // Waits until the step is committed at `tier`, a shard of it failed to get
  // there (the error names step, rank and cause), or `timeout` passes
  // (DeadlineExceeded).
  absl::StatusOr<proto::CommitRecord> WaitCommitted(const std::string& job,
                                                    uint64_t step,
                                                    proto::Tier tier,
                                                    absl::Duration timeout);
  // The newest step committed at `tier`; unless `include_suspect`, the
  // newest whose replicas were not found to disagree.
  absl::StatusOr<absl::optional<uint64_t>> LatestCommitted(
      const std::string& job, proto::Tier tier, bool include_suspect = false);
  // What is known of the steps of `commits` whose replicas disagree.
  absl::StatusOr<std::vector<proto::ReplicaCheck>> SuspectSteps(
      const std::string& job, const std::vector<proto::CommitRecord>& commits);
  // Every commit record of the job still kept, by step then tier; when the
  // coordinator knows none at the shared tier (a new cluster), those the
  // shared tier's commit markers hold.
  absl::StatusOr<std::vector<proto::CommitRecord>> ListCommits(
      const std::string& job);
  // The commit records of one step, fastest tier first (point lookups; the
  // shared tier's marker as ListCommits says).
  absl::StatusOr<std::vector<proto::CommitRecord>> ListStepCommits(
      const std::string& job, uint64_t step);
  // A shard's record: this node's own, else (with peer replication on) a
  // verified copy fetched from a peer, whose `shard_path` is a local file,
  // else (with a shared tier) its copy there. With a cluster key, this
  // node's shard file is handed out only if its seal checks; else the other
  // copies are tried and the error names the file refused. `on_demand`: a
  // copy from the shared tier's object store lands as it is read
  // (LandRange), not whole first.
  absl::StatusOr<proto::ShardRecord> GetShard(const std::string& job,
                                              uint64_t step, uint32_t rank,
                                              bool on_demand = false);
  // Lands bytes of a copy GetShard answered with `lands_on_demand`.
  absl::Status LandRange(const proto::LandRangeRequest& request);
  // Where copies of a shard are, in the order GetShard tries them (this
  // node's slot and file, peers' replicas then their disks, the shared
  // tier), and its items; nothing is fetched. NotFound when there is none.
  absl::StatusOr<proto::FindShardResponse> FindShard(const std::string& job,
                                                     uint64_t step,
                                                     uint32_t rank);
  // Whether this node saved the shard itself (its catalog has it).
  absl::StatusOr<bool> SavedHere(const std::string& job, uint64_t step,
                                 uint32_t rank);
  // The shard file this node persisted for a shard, if it has one.
  absl::StatusOr<absl::optional<std::string>> LocalShardFile(
      const std::string& job, uint64_t step, uint32_t rank);
  // Counts a finished restore: bytes per source tier, checksum mismatches,
  // fallbacks.
  // ckpt restore: makes committed `step` of `job` the state a job resumes
  // from. With `into`, a fork: a new job `into` whose only step is `step`
  // (its shard files are linked, not copied). Else in place: the steps newer
  // than `step` are moved to an archive job (named in the record) or, with
  // `discard_newer`, dropped, and the job's latest step goes back to `step`.
  // Refused while the job has shards being saved or persisted.
  absl::StatusOr<proto::RollbackRecord> RollBack(const std::string& job,
                                                 uint64_t step,
                                                 const std::string& into,
                                                 bool discard_newer);
  // Counts a restore in the metrics; when the rank resumes from the step
  // (report.resume), withdraws its newer uncommitted shards (WithdrawNewer).
  absl::Status ReportRestore(const proto::ReportRestoreRequest& report);
  // Applies retention to a job now with `policy` (what ckpt gc asks for);
  // with `dry_run` only says what it would drop. Returns the copies dropped.
  absl::StatusOr<RetentionPlan> CollectGarbage(const std::string& job,
                                               const RetentionPolicy& policy,
                                               bool dry_run = false);
  // ckpt gc JOB --memory: drops the job's memory-tier copies that are safe
  // at a durable tier and no reader holds (with `dry_run` only says which);
  // `kept` says why each other copy stays.
  struct MemoryDrop {
    std::vector<proto::ShardRecord> dropped;
    std::vector<std::pair<proto::ShardRecord, std::string>> kept;
  };
  absl::StatusOr<MemoryDrop> DropMemoryCopies(const std::string& job,
                                              bool dry_run);
  // Blocks until no shard is queued or being persisted, no garbage
  // collection runs and the files it dropped are deleted.
  void WaitIdle();
  // For a watchdog: an error naming what is stuck when the housekeeping loop
  // has not come round for `stall` plus 2 s (its ticks are 0.5 s apart), or a
  // persist in flight has not written a chunk for longer than `stall`.
  absl::Status Liveness(absl::Duration stall) const;
  // Trainer sessions and saves per job (the local API's Attach).
  JobActivity* activity() { return &activity_; }
  // Failures by cause and the recoveries (the local API's ListFailures and
  // trainer exits).
  FailureLog* failures() { return &failures_; }
  // Each job's wall time split into training, stall, recovery and lost work
  // (the local API's sessions).
  Goodput* goodput() { return &goodput_; }
  // Trainers whose sessions are open but whose saves stopped (the local
  // API's sessions).
  HangWatch* hangs() { return &hangs_; }

  const ServiceOptions& options() const { return options_; }
  // What the /metrics endpoint serves.
  Metrics* metrics() { return &metrics_; }
  Catalog* catalog() { return catalog_.get(); }
  Coordinator* coordinator() { return coordinator_.get(); }
  StagingArena* arena() { return arena_.get(); }
  // Null unless peer replication is on.
  Replicator* replicator() { return replicator_.get(); }
  ParityTier* parity() { return parity_.get(); }
  // Null when publication is off.
  Publisher* publisher() { return publisher_.get(); }
  // Makes this node a subscriber of `topic` (false: it was one already).
  // FailedPrecondition without the peer tier or publication.
  absl::StatusOr<bool> Subscribe(const std::string& topic);
  std::string ShardPath(const std::string& job, uint64_t step,
                        uint32_t rank) const;

 private:
  // A wait for (job, step) at `tier` that cannot end: a newer step is
  // committed there and nothing of `step` is kept here (collected, or never
  // saved here). OK otherwise.
  absl::Status NotWaitedFor(const std::string& job, uint64_t step,
                            proto::Tier tier);
  // With a cluster key, checks `r`'s shard file (its manifest's seal and
  // checksums). A file refused is dropped from `r` when its slot is still
  // there; else the error names it (the restore looks elsewhere).
  absl::Status SealedForRestore(proto::ShardRecord& r) const;
  explicit CheckpointService(io::FileSystem* fs, ServiceOptions options);
  absl::Status Recover();
  // Loads the health records a previous run kept (RestoreHealth: returns
  // the jobs that were running) and keeps new ones (KeepHealth) in the
  // catalog; an error is logged, not returned.
  std::vector<std::string> RestoreHealth();
  void KeepHealth(const proto::FailureHistory& history);
  void KeepHealth(const proto::GoodputRecord& record);
  // With options_.agree_cluster_key: the cluster's key, made or read through
  // the coordinator, installed for the process.
  absl::Status InstallAgreedClusterKey();
  // Queues a staged shard for the persist threads (with persist_newest,
  // skipping the rank's older ones still waiting).
  void Enqueue(const SlotId& id);
  // `id` will not be persisted: step `newer` of its rank took its place.
  void SkipPersist(const SlotId& id, uint64_t newer);
  // Persist threads take queued shards first, then garbage collection asked
  // for a job (after a persist or a memory-tier commit).
  void PersistLoop();
  // Persists one shard the queue handed out and records how it ended.
  void PersistQueued(const SlotId& id);
  void CollectQueued(const std::string& job);
  // Links the persisted shards of `steps` of `from` into job `to` and commits
  // them there on disk.
  absl::Status CopySteps(const std::string& from,
                         const std::vector<proto::ShardRecord>& shards,
                         const std::set<uint64_t>& steps,
                         const std::string& to);
  // RollBack's steps (checkpoint_service_steps.cc): the target committed on
  // disk, whole, and no shard of the job in flight (returns the steps after
  // it); a fork into a new job; the newer committed steps archived; the
  // newer steps' copies dropped.
  absl::StatusOr<std::set<uint64_t>> StepsAfterRollBackTarget(
      const std::string& job, uint64_t step,
      const std::vector<proto::ShardRecord>& shards, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(gc_mu_);
  absl::Status ForkInto(const std::string& job, uint64_t step,
                        const std::vector<proto::ShardRecord>& shards,
                        const std::string& into, const std::string& what,
                        proto::RollbackRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(gc_mu_);
  absl::Status ArchiveSteps(const std::string& job,
                            const std::set<uint64_t>& newer,
                            const std::vector<proto::ShardRecord>& shards,
                            proto::RollbackRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(gc_mu_);
  absl::Status DropStepsAfter(const std::string& job, uint64_t step,
                              const std::vector<proto::ShardRecord>& shards)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(gc_mu_);
  void DeclareMetrics();
  // Start's steps: the catalog, coordinator, cluster key, staging arena and
  // file recycler; then each configured tier beyond this node.
  absl::Status OpenLocalState();
  absl::Status StartPeerTier();
  absl::Status StartParityTier();
  absl::Status StartSharedTier();
  absl::Status StartPublisher();
  // A vote committed `step` at `tiers`: the health figures, and waiters look
  // again.
  // Appends the shared tier's commit markers of `job` (of `step` only, if
  // given); a tier that cannot be read adds nothing (logged).
  void AddMarkers(const std::string& job, absl::optional<uint64_t> step,
                  std::vector<proto::CommitRecord>* commits);
  void Committed(const std::string& job, uint64_t step,
                 const std::vector<proto::Tier>& tiers);
  // Persists one staged shard; returns the error that marks it FAILED.
  absl::Status Persist(proto::ShardRecord& record);
  // Persist's steps (checkpoint_service_persist.cc): the staged slot, mapped
  // and checked; the shard file written from it (with `base`, an incremental
  // save), the persist watched for liveness meanwhile; the record stored;
  // the vote; the figures; the tiers that copy it off the node next.
  struct WrittenShard {
    proto::ShardManifest manifest;
    uint64_t manifest_xxh3 = 0;
    snapshot::ShardWriteStats stats;
  };
  struct ShardSizes {
    uint64_t raw = 0;     // the state's bytes
    uint64_t stored = 0;  // in this file
    uint64_t reused = 0;  // raw bytes left in base shards
  };
  // What a manifest's file stores, and what it leaves in its bases.
  static ShardSizes SizesOf(const proto::ShardManifest& manifest);
  absl::StatusOr<std::shared_ptr<io::MappedFile>> MapStaged(
      const proto::ShardRecord& record);
  absl::StatusOr<WrittenShard> WriteShard(
      const proto::ShardRecord& record, io::MappedFile& slot,
      const std::string& path, std::shared_ptr<const snapshot::ShardBase> base);
  absl::StatusOr<ShardSizes> RecordPersisted(proto::ShardRecord& record,
                                             const std::string& path,
                                             WrittenShard written);
  std::vector<proto::Tier> VoteLocalDisk(const proto::ShardRecord& record);
  void CountPersist(const proto::ShardRecord& record, const ShardSizes& sizes,
                    const snapshot::ShardWriteStats& stats,
                    absl::Duration took);
  void HandOff(const proto::ShardRecord& record);
  // Incremental saves (checkpoint_service_bases.cc). The base `record` may
  // store its unchanged chunks in: the rank's newest persisted shard that is
  // committed on disk (among its last few), pinned against garbage
  // collection until UnpinBase; null for a full save.
  std::shared_ptr<const snapshot::ShardBase> PinBase(
      const proto::ShardRecord& record);
  void UnpinBase(const proto::ShardRecord& record,
                 const std::shared_ptr<const snapshot::ShardBase>& base);
  // `base` with the way to its raw bytes, when its staging slot is still in
  // memory (live, or released and not yet reused): changed float chunks may
  // then be stored as XOR deltas against it. Else `base` as it is.
  std::shared_ptr<const snapshot::ShardBase> WithBaseBytes(
      const proto::ShardRecord& record,
      std::shared_ptr<const snapshot::ShardBase> base);
  // `record` was persisted with `manifest`: the base of the rank's next save.
  void RememberBase(const proto::ShardRecord& record,
                    proto::ShardManifest manifest, uint64_t manifest_xxh3);
  // `base` is about to be replaced by a new save of its step: every persisted
  // shard of its rank that stores chunks in it, or in a shard rewritten so,
  // is rewritten self-contained first (the same bytes as its copies on other
  // tiers), so that none is left pointing at a file that is gone or another.
  absl::Status DetachDependents(const proto::ShardRecord& base)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(gc_mu_);
  // Retention with the configured policy, after a persist or a memory commit.
  void CollectGarbage(const std::string& job);
  // Makes way for a new save of a step this rank saved before without the
  // step getting committed (the job restarted from an earlier step): takes
  // the shard out of the persist queue, waits for a persist of it in flight,
  // withdraws its vote and deletes it. AlreadyExists once the step is
  // committed at any tier.
  absl::Status Supersede(const proto::ShardRecord& old);
  // Withdraws `rank`'s shards of steps after `step` that are not committed
  // (staging aborted, votes withdrawn, records and files deleted): the rank
  // resumed from `step`, and what it saved after it belongs to an abandoned
  // run. Committed steps stay.
  absl::Status WithdrawNewer(const std::string& job, uint32_t rank,
                             uint64_t step);
  // K peers verified a replica of `shard`: recorded, then voted at TIER_PEER.
  void Replicated(const proto::ShardRecord& shard,
                  const std::vector<std::string>& nodes);
  // After the coordinator rejoined (a lease lost and taken anew), votes
  // again for every shard this node holds: the votes refused while it was
  // fenced.
  void RevoteIfRejoined();
  // Peers that held replicas left: their shards are pushed again to others.
  void PeersLost(const std::vector<std::string>& lost);
  // A push of `job`'s shard reached peer `node` or could not: a
  // peer_unreachable episode of the job begins or heals.
  void PeerReached(const std::string& job, const std::string& node,
                   const absl::Status& status);
  // The steps the peer and shared tiers keep (their newest commits there).
  std::set<uint64_t> KeptElsewhere(
      const std::vector<proto::CommitRecord>& commits) const;
  // Votes `tier` for `shard` (reached after its persist) and notes commits.
  void VoteLater(const proto::ShardRecord& shard, proto::Tier tier);
  // Every parity block of the shard's group is complete: recorded, and
  // voted at TIER_PEER.
  void ParityProtected(const proto::ShardRecord& shard);
  // Both: when the shard is still the one recorded, `record` notes how it is
  // safe in its record, and TIER_PEER is voted.
  void PeerTierReached(const proto::ShardRecord& shard,
                       const std::function<void(proto::ShardRecord&)>& record,
                       const char* what_recorded);
  // Drops the copies `actions` name (catalog first, in synced batches, then
  // slots and files); returns how many were applied, and the first error.
  // Actions on files pinned meanwhile as bases lose their drop_file.
  std::pair<size_t, absl::Status> ApplyDrops(
      std::vector<RetentionAction>& actions);
  // One line per collection that dropped something: which steps lost which
  // copies, and what each tier keeps.
  void LogDecisions(const std::string& job, const RetentionPlan& plan,
                    const std::set<uint64_t>& elsewhere);

  // The memory tier as a cache (checkpoint_service_memory.cc). Every
  // memory-tier copy of `job` (every job's when empty), with why it must
  // stay (WhyKept).
  absl::StatusOr<std::vector<MemoryCopy>> MemoryCopies(const std::string& job);
  // A save of `job` needs `needed` bytes more than the budget has: evicts
  // copies that are safe elsewhere (PlanEviction). Returns the bytes freed.
  uint64_t RelieveMemoryPressure(const std::string& job, uint64_t needed);
  // Nothing could make room: shards whose persist failed while their slot
  // is still here are persisted again (at most every two seconds each), so
  // that a disk fault that has passed (space freed, a device back) lets their
  // steps reach the disk and their memory become free to go. Called under
  // gc_mu_.
  void RetryFailedPersists(const std::vector<MemoryCopy>& copies);
  // Drops `evictions` under gc_mu_ and counts them in the metrics.
  uint64_t Evict(const std::vector<Eviction>& evictions);
  // Jobs idle longer than idle_job_memory_ttl give up their safe copies.
  void DropIdleJobsMemory();
  // The housekeeper thread: saves waiting for memory, idle jobs.
  void Housekeeping();
  // Each rank HangWatch finds hung is a trainer_hung failure.
  void NoteHungTrainers();
  // The jobs with a trainer session open here (NodeWatch's).
  std::vector<std::string> ServedJobs() const;
  // When idle, housekeeping comes round this often.
  static constexpr absl::Duration kHousekeepingTick = absl::Milliseconds(500);
  // What holds the memory budget, for the error a save gets when it found
  // none: jobs, steps, bytes and why each stays.
  std::string DescribeMemoryHolders();

  io::FileSystem* const fs_;
  const ServiceOptions options_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<Catalog> catalog_;
  std::shared_ptr<Coordinator> coordinator_;
  std::unique_ptr<StagingArena> arena_;
  std::unique_ptr<FileRecycler> recycler_;
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<ParityTier> parity_;
  std::unique_ptr<SharedTier> shared_;
  std::unique_ptr<Publisher> publisher_;
  // After publisher_: stops before it.
  std::unique_ptr<Subscriptions> subscriptions_;
  // Compares replicated state across ranks (made with coordinator_).
  std::unique_ptr<ReplicaAudit> audit_;

  // The objects below own their state and their locks. Lock order (the
  // only nesting there is): gc_mu_, then the pin lock (an
  // IncrementalBases::Freeze, and Pin's), then the catalog's, the arena's and
  // the coordinator's, which call back into nothing here. revote_mu_ is held
  // over votes, never with gc_mu_. The leaves take no other lock of the
  // service under their own: PersistQueue, ChangeCounter, Liveness,
  // begin_mu_, JobHealth (which calls only Metrics) and Metrics.
  PersistQueue queue_;
  IncrementalBases bases_;
  // Bumped when something WaitCommitted waits for may have changed.
  ChangeCounter changes_;
  // RevoteIfRejoined: held for a whole re-vote.
  absl::Mutex revote_mu_;
  int rejoins_seen_ ABSL_GUARDED_BY(revote_mu_) = 0;  // Coordinator::Rejoins()
  Metrics metrics_;
  JobHealth health_{&metrics_};
  Stragglers stragglers_{&metrics_};
  HangWatch hangs_{options_.trainer_hung_after};
  Goodput goodput_{&metrics_,
                   [this](const proto::GoodputRecord& r) { KeepHealth(r); }};
  FailureLog failures_{
      &metrics_, [this](const proto::FailureHistory& h) { KeepHealth(h); },
      [this](const std::string& job, absl::Time at, int rank,
             absl::Duration unseen) {
        goodput_.Failed(job, at, rank, unseen);
      }};
  absl::Mutex gc_mu_;  // one garbage collection at a time
  absl::Mutex begin_mu_;
  std::set<SlotId> beginning_ ABSL_GUARDED_BY(begin_mu_);  // in BeginStage
  JobActivity activity_;
  // RetryFailedPersists: when each shard was last persisted again.
  std::map<SlotId, absl::Time> retried_ ABSL_GUARDED_BY(gc_mu_);
  // The housekeeping loop's rounds and the persists' chunks.
  daemon::Liveness liveness_{kHousekeepingTick};
  std::vector<std::thread> workers_;
  std::thread housekeeper_;   // Housekeeping
  std::thread hang_watcher_;  // NoteHungTrainers, four times a second
  // Nodes lost from under the jobs (with etcd); after everything it uses.
  std::unique_ptr<NodeWatch> node_watch_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVICE_CHECKPOINT_SERVICE_H_
