// Checkpointer is libckpt's C++ API, linked into each trainer rank. It talks to
// the node's ckptd only through the local API (gRPC over the daemon's unix
// socket) and the staging files:
//
//   auto ckpt = Checkpointer::Connect({.job = "llama", .rank = r, .world_size =
//   n}); ckpt->RegisterTensor("w", DTYPE_FLOAT32, w.data(), {N}, {r * N / n},
//   {N / n}); ckpt->RegisterBytes("rng", &rng_state); auto save =
//   ckpt->SaveAsync(step);      // reserves a slot, copies in the background
//   save->WaitStaged();                     // state may be mutated again
//   save->WaitCommitted(TIER_LOCAL_DISK);   // optional: durable on disk for
//   every rank ckpt->Restore(*ckpt->LatestCommitted());
//
// A failed save never throws or aborts: its error comes back from
// WaitStaged/WaitCommitted and from the next SaveAsync (LastSaveError), and
// training goes on.
//
// Thread-safety: one thread drives a Checkpointer; SaveHandles may be waited on
// from any thread.
#ifndef CKPT_CLIENT_CHECKPOINTER_H_
#define CKPT_CLIENT_CHECKPOINTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "client/daemon_session.h"
#include "client/device_stager.h"
#include "client/fork_snapshot.h"
#include "client/restore_context.h"
#include "kernels/device.h"
#include "proto/catalog.pb.h"
#include "proto/publish.pb.h"

namespace ckpt::client {

// kCpuQueued: host memory through the CUDA device's CPU twin (its work queued
// on a thread and completed later, chunk hashes taken "on the device"): the
// GPU save and restore paths, run where there is no GPU (tests).
enum class DeviceKind { kCpu, kCuda, kCpuQueued };

// How a save captures tensors in host memory (DeviceKind::kCpu). The
// environment variable CKPT_HOST_SNAPSHOT=copy|fork overrides the option.
enum class HostSnapshot {
  // A helper thread copies the tensors into the slot; WaitStaged waits for
  // the copy.
  kCopy,
  // A forked child process writes the tensors into the slot from a
  // copy-on-write view of memory; WaitStaged waits only for the fork. The
  // trainer pays later instead, in page faults on its first writes after the
  // fork (client/fork_snapshot.h): worth it when the trainer's memory is in
  // huge pages and it does not rewrite its state at once. Falls back to a
  // copy where a fork would not capture the memory (shared or do-not-fork
  // mappings).
  kFork,
};

struct CheckpointerOptions {
  std::string job;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // The daemon's socket; by default ckptd's default for this uid.
  std::string socket_path;
  absl::Duration rpc_timeout = absl::Seconds(30);

  // Where registered tensors live: host memory (kCpu), or device memory of GPU
  // `cuda_device` (kCuda; byte items are always host memory).
  DeviceKind device = DeviceKind::kCpu;
  int cuda_device = 0;
  // kCuda: the stream the trainer computes on (a cudaStream_t; null is the
  // default stream). A save's copy starts after the work queued on it when
  // SaveAsync is called; with `order_compute_stream`, work queued on it after
  // SaveAsync waits for the copy, so the host thread never has to block in
  // WaitStaged before the next step's kernels overwrite the state.
  void* compute_stream = nullptr;
  bool order_compute_stream = true;
  // kCuda: device tensors of at most `gather_max_tensor_bytes` are gathered
  // by one kernel launch per batch through a device buffer of at most
  // `gather_buffer_bytes`, then copied to the slot by one D2H copy per batch
  // (client/device_stager.h); larger ones by a D2H copy each. 0 turns
  // gathering off. Without device memory for the buffer, each tensor is
  // copied (stats().gather_refused says why).
  uint64_t gather_max_tensor_bytes = 1 << 20;
  uint64_t gather_buffer_bytes = 64 << 20;
  // kCuda: a restore of device tensors reads them into a pinned host buffer
  // of at most this many bytes, half at a time, each half copied to the
  // device while the other is read (client/device_upload.h); a restore onto
  // another number of ranks assembles boxes larger than a half in slabs.
  uint64_t restore_buffer_bytes = 256 << 20;
  // Staging slots kept mapped (and, on a GPU, pinned) between saves. ckptd
  // reuses slot files, so a steady job maps and pins each slot once.
  int mapped_slots = 4;
  HostSnapshot host_snapshot = HostSnapshot::kCopy;
  // Once a save's copy is in the slot (WaitStaged has returned: the trainer
  // goes on), hash the slot's chunks on the copier's threads and hand the
  // hashes to ckptd with the slot (StagedItem.chunk_xxh3): its persist of a
  // chunk stored raw then only writes it, and a restore from the memory tier
  // checks its copy before the step is persisted. Not with kFork.
  // CKPT_HASH_STAGED=0 turns it off.
  bool hash_staged_chunks = true;
  // A checkpointer that only reads (a probe of a tool or a library reading a
  // step's items): its restores leave the rank's newer shards alone. A
  // trainer's restore (the default) is where it resumes, and withdraws the
  // rank's shards of newer, uncommitted steps (see Restore). It opens no
  // session with ckptd: it is not one of the job's trainers (whose sessions
  // tell ckptd when a trainer died, and time the job's goodput).
  bool read_only = false;
  // How long a restore waits for a node that may hold the only copy of the
  // rank's shard while it restarts (ckptd names it: a peer registered but not
  // answering, or one lost less than --reprotect-delay ago), asking again
  // with a growing pause; then the restore fails with ckptd's error.
  absl::Duration restore_peer_wait = absl::Seconds(60);
};

// What the Checkpointer did, for tests and benchmarks.
struct CheckpointerStats {
  uint64_t slots_mapped = 0;  // slot mappings made (and pinned) afresh
  uint64_t slots_reused = 0;  // saves that found their slot already mapped
  uint64_t saves_forked = 0;  // host tensors captured by a fork
  uint64_t saves_copied = 0;  // host tensors copied by a helper thread
  // Chunk hashes the device took of its tensors (kCuda, kCpuQueued) instead
  // of the host hashing the slot after the copy.
  uint64_t chunks_hashed_on_device = 0;
  // Device tensors copied by gather launches, and those launches (kCuda,
  // kCpuQueued); why the latest save gathered nothing, if it had tensors to.
  uint64_t tensors_gathered = 0;
  uint64_t gather_launches = 0;
  std::string gather_refused;
  // kFork: why the latest save was not forked (empty when it was).
  std::string fork_refused;
  // kFork: the share of the tensors' resident memory in huge pages.
  double huge_page_share = 0;
};

// The connection to ckptd (defined in checkpointer_internal.h).
class CheckpointerRpc;
// Runs a Checkpointer's saves (client/save_stager.h).
class SaveStager;

// The most recent failure of a save, shared by a Checkpointer and its
// SaveHandles (which may outlive it).
class FailureLog {
 public:
  void Record(absl::Status status) {
    absl::MutexLock lock(&mu_);
    last_ = std::move(status);
  }
  absl::Status Take() {
    absl::MutexLock lock(&mu_);
    return std::exchange(last_, absl::OkStatus());
  }

 private:
  absl::Mutex mu_;
  absl::Status last_ ABSL_GUARDED_BY(mu_);
};

// A save in flight. It may be waited on after its Checkpointer is gone: it
// shares the connection to ckptd.
class SaveHandle {
 public:
  uint64_t step() const { return step_; }
  // Returns once the trainer may mutate its state again: the state is copied
  // into the slot, or captured by a fork whose child is writing it there
  // (HostSnapshot::kFork), or the save failed. A failure after that is
  // reported by WaitCommitted.
  absl::Status WaitStaged();
  // Whether WaitStaged would return at once (a poll).
  bool Staged();
  // Device tensors (kCuda): makes work queued later on `stream` (a
  // cudaStream_t) wait for this save's copy, without blocking the host: with
  // `order_compute_stream` off, the trainer's forward and backward kernels run
  // while the save copies, and it calls OrderStream(compute) just before the
  // optimizer step that overwrites the state. Host tensors: WaitStaged().
  // Only while the save's Checkpointer lives.
  absl::Status OrderStream(void* stream);
  // Waits until every rank's shard of the step reached `tier`.
  absl::Status WaitCommitted(proto::Tier tier = proto::TIER_LOCAL_DISK,
                             absl::Duration timeout = absl::Minutes(10));
  // Once the step is committed on disk, publishes it as the next version of
  // `topic` for rollout and inference readers (docs/publish.md): the items
  // `items` globs choose (none: all), float32 cast to bfloat16 with `cast`
  // "bf16". One rank calls it, on a node that holds every rank's shard.
  absl::StatusOr<proto::VersionRecord> Publish(
      const std::string& topic, const std::vector<std::string>& items = {},
      const std::string& cast = "", absl::Duration timeout = absl::Minutes(10));

 private:
  friend class SaveStager;
  SaveHandle(std::shared_ptr<CheckpointerRpc> rpc,
             std::shared_ptr<FailureLog> failures, std::string job,
             uint64_t step)
      : rpc_(std::move(rpc)),
        failures_(std::move(failures)),
        job_(std::move(job)),
        step_(step) {}
  void Copied(absl::Status status);
  void Finish(absl::Status status);
  // The device's copy, for OrderStream (null: host tensors).
  kernels::Device* device_ = nullptr;
  std::shared_ptr<kernels::Event> copied_event_;

  const std::shared_ptr<CheckpointerRpc> rpc_;
  const std::shared_ptr<FailureLog> failures_;
  const std::string job_;
  const uint64_t step_;
  absl::Mutex mu_;
  bool copied_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status copy_status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class Checkpointer {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Connect(
      const CheckpointerOptions& options);
  ~Checkpointer();

  // Registers a tensor: this rank's box of a global tensor, row-major, in the
  // memory of the options' device (host memory for kCpu, device memory for
  // kCuda). The memory must stay valid while the Checkpointer lives.
  absl::Status RegisterTensor(const std::string& name, proto::DType dtype,
                              void* data, std::vector<int64_t> global_shape,
                              std::vector<int64_t> box_offset,
                              std::vector<int64_t> box_length);
  // The registered tensor `name` holds this rank's own values even where
  // other ranks register the same box (a per-rank buffer saved whole): its
  // saves are not compared with theirs for silent data corruption, which
  // every tensor box saved by several ranks otherwise is.
  absl::Status MarkRankLocal(const std::string& name);
  // Registers an opaque byte item (RNG state, data-loader position); read at
  // every save, replaced at restore.
  absl::Status RegisterBytes(const std::string& name, std::string* value);

  // Starts saving `step`. The copy runs in the background; see SaveHandle.
  absl::StatusOr<std::shared_ptr<SaveHandle>> SaveAsync(uint64_t step);
  // The error of the most recent save that failed since the last call (then
  // cleared).
  absl::Status LastSaveError();

  // The newest step committed at `tier` for this job.
  absl::StatusOr<absl::optional<uint64_t>> LatestCommitted(
      proto::Tier tier = proto::TIER_LOCAL_DISK);
  // The steps committed at `tier` (or better) that the daemon still keeps,
  // oldest first.
  absl::StatusOr<std::vector<uint64_t>> ListCommitted(
      proto::Tier tier = proto::TIER_LOCAL_DISK);
  // The kept steps whose replicas disagree (silent data corruption
  // suspected, daemon/health/replica_check.h): RestoreLatest skips them, a
  // Restore of one reads the majority's bytes where there is a majority.
  absl::StatusOr<std::vector<proto::ReplicaCheck>> SuspectSteps();
  // Restores every registered item from `step`, from the memory tier when the
  // slot is still there, else from the persisted shard (verified). Once the
  // shard is persisted, the slot's bytes are checked against the manifest's
  // checksums first, and a mismatch falls back to the file; a shard restored
  // before its persist finished is copied from the slot as the trainer wrote
  // it. When the step was saved by another number of ranks, or with other
  // boxes, each tensor's box is assembled from the saved boxes it overlaps
  // (only their overlapping byte ranges are read from files); byte items come
  // from the saved rank with this rank's number, else from saved rank 0.
  // Unless the options say read_only, the rank then resumes from `step`: the
  // daemon withdraws this rank's shards of newer steps that are not committed
  // (a killed run's saves), so that they never commit together with the
  // shards the resumed run saves for the same steps. A trainer's ranks must
  // all restore before any of them saves again (collective training steps
  // see to that).
  absl::Status Restore(uint64_t step);
  // Restores the newest step committed at `tier` and returns it (nullopt:
  // nothing is committed there yet, nothing restored). Retention may drop a
  // step the moment a newer one commits (another node's replication landing
  // during a restart, say): the newer one is then restored instead.
  absl::StatusOr<absl::optional<uint64_t>> RestoreLatest(
      proto::Tier tier = proto::TIER_LOCAL_DISK);

  // What the daemon knows about this rank's shard of `step` (state, sizes,
  // timestamps).
  absl::StatusOr<proto::ShardRecord> DescribeShard(uint64_t step);

  // Failure notification: watches the nodes of the coordination store
  // through ckptd (etcd's membership with --coordinator etcd://; a single
  // node with the embedded backend). `callback` runs on a watcher thread with
  // the nodes that left since the previous call; LostNodes() polls the same.
  using FailureCallback =
      std::function<void(const std::vector<std::string>& lost)>;
  absl::Status WatchFailures(FailureCallback callback);
  // Every node lost since WatchFailures started, in the order seen.
  std::vector<std::string> LostNodes() const;

  const CheckpointerOptions& options() const { return options_; }
  CheckpointerStats stats() const;

 private:
  using Rpc = CheckpointerRpc;
  explicit Checkpointer(const CheckpointerOptions& options);
  // Restore minus the report to the daemon: RestoreOnce again while a node
  // that may hold the only copy is restarting (Unavailable), up to
  // `restore_peer_wait`.
  absl::Status RestoreFrom(uint64_t step);
  absl::Status RestoreOnce(uint64_t step, const proto::CommitRecord& commit,
                           const ReplicasAvoided& avoided,
                           const std::string& what);
  // What a restore's collaborators work on (the items, ckptd, the device,
  // the report).
  RestoreContext Restoring();
  // The name is valid and not registered yet.
  absl::Status CheckNewName(const std::string& name) const;
  // Tells ckptd this trainer is attached (its job is not idle), from the
  // first registration on: a Checkpointer that only asks questions (tools,
  // polls) is no trainer.
  void Attach();

  const CheckpointerOptions options_;
  std::shared_ptr<Rpc> rpc_;
  std::unique_ptr<kernels::Device> device_;
  // A device with streams: queues the copies of a save's tensors and their
  // chunk hashes (kCuda, kCpuQueued; null otherwise).
  std::unique_ptr<DeviceStager> stager_;
  std::vector<RegisteredItem> items_;
  const std::shared_ptr<FailureLog> failures_ = std::make_shared<FailureLog>();
  // Runs the saves (client/save_stager.h): made by Connect, reset first by
  // the destructor.
  std::unique_ptr<SaveStager> saves_;
  // What the restore in progress read, reported to ckptd when it succeeds.
  RestoreReport report_;  // touched only by the thread calling Restore
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<DaemonSession> session_;
  // The failure watcher (WatchFailures).
  std::thread watcher_;
  std::atomic<bool> stop_watching_{false};
  mutable absl::Mutex mu_;
  std::vector<std::string> lost_ ABSL_GUARDED_BY(mu_);
};

// ckptd's default socket: $CKPT_SOCKET when set, else the calling uid's
// /tmp/ckpt-<uid>/ckptd.sock.
std::string DefaultSocketPath();

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_CHECKPOINTER_H_
