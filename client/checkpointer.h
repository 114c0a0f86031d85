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
#include "io/thread_pool.h"
#include "kernels/device.h"
#include "proto/catalog.pb.h"
#include "proto/daemon.pb.h"
#include "snapshot/box.h"
#include "snapshot/shard_reader.h"

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
  // rank's shards of newer, uncommitted steps (see Restore).
  bool read_only = false;
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

// The connection to ckptd (defined in checkpointer.cc).
class CheckpointerRpc;

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

 private:
  friend class Checkpointer;
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
  friend class SaveHandle;
  struct Registered;
  struct MappedSlot;
  struct SavedRank;
  using Rpc = CheckpointerRpc;
  explicit Checkpointer(const CheckpointerOptions& options);
  // Tells the daemon that the copy of `step` is done (StageComplete) or
  // failed (AbortStage), and finishes the handle. Runs on `handover_`.
  void HandOver(const std::shared_ptr<SaveHandle>& handle, uint64_t step,
                const std::vector<proto::StagedItem>& layout,
                absl::Status status);
  // Restore from a slot: copies every registered item (`sources`: their
  // places in the slot) chunk by chunk on several threads, checking each
  // chunk where it landed (host memory, or for device tensors the pinned
  // buffer they then leave for the device from; client/device_upload.h)
  // against the raw checksum of the persisted manifest (`reader`), or when it
  // is null (not persisted yet) against the hashes the saving client took
  // (StagedItem.chunk_xxh3).
  absl::Status CopyAndVerify(
      const uint8_t* slot, const std::vector<const proto::StagedItem*>& sources,
      const snapshot::ShardReader* reader);
  // Checks the slot's items against the raw chunk checksums of the persisted
  // manifest (`reader`), or when it is null (not persisted yet) against the
  // hashes the saving client took of the slot (items without: not
  // checked).
  absl::Status VerifySlot(const uint8_t* slot,
                          const std::vector<const proto::StagedItem*>& sources,
                          const snapshot::ShardReader* reader) const;
  // Restore minus the report to the daemon.
  absl::Status RestoreFrom(uint64_t step);
  // RestoreFrom's restore of this rank's own shard, as saved, from the copies
  // ckptd names; `vanished` when they were gone by the time they were read.
  absl::Status RestoreShard(uint64_t step, uint32_t saved_world,
                            const std::string& what, bool* vanished);
  // RestoreShard's steps (checkpointer_restore.cc). The registered items'
  // places in the saved shard, each described alike; nullopt when the same
  // tensors were saved with other boxes (a reshard).
  absl::StatusOr<std::optional<std::vector<const proto::StagedItem*>>>
  MatchSaved(const proto::ShardRecord& shard, const std::string& what) const;
  // The shard's file, opened (its manifest read), or why not.
  struct ShardFile {
    std::unique_ptr<snapshot::ShardReader> reader;
    absl::Status status = absl::NotFoundError("no shard file");
  };
  static ShardFile OpenShardFile(const proto::ShardRecord& shard);
  // From the shard's slot, verified against `reader`'s checksums (null: the
  // saving client's hashes).
  absl::Status RestoreFromSlot(
      const proto::ShardRecord& shard,
      const std::vector<const proto::StagedItem*>& sources,
      const snapshot::ShardReader* reader);
  absl::Status RestoreFromShardFile(const proto::ShardRecord& shard,
                                    const ShardFile& file,
                                    const std::string& what, bool* vanished);
  // This rank's copy is `lost`: from other ranks that saved the same boxes.
  absl::Status RestoreFromOtherRanks(uint64_t step, uint32_t saved_world,
                                     const std::string& what,
                                     const absl::Status& lost);
  // Restores a shard on no tier of this node, as saved (same boxes), by
  // streaming its file from a peer straight into the registered memory
  // (proto PeerShardOffer); FailedPrecondition or NotFound when that does not
  // apply. A failure may leave the registered memory half written.
  absl::Status RestoreFromPeerStream(uint64_t step, const std::string& what);
  // Restore onto a layout other than the saved one (`saved_world` ranks).
  absl::Status RestoreResharded(uint64_t step, uint32_t saved_world,
                                const std::string& what);
  // RestoreResharded's steps (checkpointer_reshard.cc): every saved rank's
  // shard described; the pinned halves for device tensors; a byte item from
  // the saved rank of this number (else another); a tensor's overlapping
  // saved boxes, each assembled from one of its replicas, on the host or in
  // slabs through the halves to the device.
  struct Reshard;
  struct SavedBox;
  absl::StatusOr<std::vector<SavedRank>> DescribeSavedRanks(
      uint64_t step, uint32_t saved_world, const std::string& what);
  absl::Status PinReshardHalves(Reshard& reshard);
  absl::Status RestoreBytesResharded(Registered& r, Reshard& reshard);
  absl::StatusOr<std::vector<SavedBox>> SavedBoxesOf(const Registered& r,
                                                     Reshard& reshard);
  // Copies the overlap of saved `box` (`staged` in `from`) with `want`, laid
  // out in `dst`; returns the elements copied.
  absl::StatusOr<int64_t> CopyOverlap(const Registered& r,
                                      const snapshot::Box& box, SavedRank& from,
                                      const proto::StagedItem& staged,
                                      const snapshot::Box& want,
                                      absl::Span<uint8_t> dst,
                                      Reshard& reshard);
  // Fills `dst`, laid out over `part_box` (the rank's box or a slab of it
  // starting at element `first`), from every saved box overlapping it.
  absl::Status AssembleBox(const Registered& r,
                           const std::vector<SavedBox>& boxes,
                           const snapshot::Box& part_box, int64_t first,
                           absl::Span<uint8_t> dst, Reshard& reshard);
  absl::Status UploadResharded(Registered& r,
                               const std::vector<SavedBox>& boxes,
                               Reshard& reshard);
  // Opens a saved rank's bytes: its slot if it verifies (or is not persisted
  // yet), else its shard file.
  absl::Status OpenSavedRank(SavedRank& saved, const std::string& what);
  absl::Status OpenSavedRankOnce(SavedRank& saved, const std::string& what);
  // Gives back the slot of a save that failed before its copy started (the
  // abort is queued behind earlier hand-overs); returns the error to report.
  absl::Status Abandon(uint64_t step, absl::Status status);
  // The name is valid and not registered yet.
  absl::Status CheckNewName(const std::string& name) const;
  // Waits for the copy in flight and every queued hand-over.
  void DrainHandovers();
  // The mapping of the slot file at `path` (`bytes` long): the cached one
  // when the daemon handed out a slot file this process mapped before, else a
  // fresh mapping, pinned for the device.
  absl::StatusOr<std::shared_ptr<MappedSlot>> MapSlot(const std::string& path,
                                                      uint64_t bytes);

  // Whether this save's host tensors (`regions`) are captured by a fork;
  // records why not in stats_.fork_refused.
  bool ShouldFork(const std::vector<HostRegion>& regions);

  // SaveAsync's steps (checkpointer_save.cc). The slot layout with the byte
  // items sized as they are now, and the slot size it needs.
  struct PendingSave;
  std::vector<proto::StagedItem> SizedLayout();
  static uint64_t SlotBytes(const std::vector<proto::StagedItem>& layout);
  // Asks ckptd for the slot.
  absl::StatusOr<proto::BeginStageResponse> BeginStage(uint64_t step,
                                                       uint64_t bytes);
  // Opens the slot: for a fork, a descriptor to write it; else mapped.
  absl::Status OpenSlot(PendingSave& save,
                        const proto::BeginStageResponse& slot);
  // Copies the byte items into the slot now (the caller may change them as
  // soon as SaveAsync returns).
  absl::Status CaptureByteItems(PendingSave& save);
  // Copies the tensors into the slot at `base`: on host threads, or queued
  // on the device's stream.
  absl::Status CopyTensors(const std::vector<proto::StagedItem>& layout,
                           uint8_t* base);
  // A device with streams: queues the tensors' copies and chunk hashes, and
  // the event the compute stream and the handle wait for.
  absl::Status QueueDeviceCopies(PendingSave& save);
  // On the copier thread: the copy (a fork, host threads, or waiting for the
  // device), the slot's hashes, the stats, then the hand-over queued.
  void FinishCopy(const std::shared_ptr<PendingSave>& save);
  absl::Status CopyByFork(PendingSave& save, bool* forked);
  absl::Status CopyInProcess(PendingSave& save);
  void CountSave(const PendingSave& save, const absl::Status& status,
                 bool forked);

  const CheckpointerOptions options_;
  HostSnapshot host_snapshot_;  // the option, or CKPT_HOST_SNAPSHOT
  // kFork: the mappings under the registered tensors
  // (client/fork_snapshot.h), inspected at the first save after a
  // registration. Touched only by the thread driving saves.
  bool inspected_ = false;
  ForkInspection inspection_;
  std::shared_ptr<Rpc> rpc_;
  std::unique_ptr<kernels::Device> device_;
  // A device with streams: queues the copies of a save's tensors and their
  // chunk hashes (kCuda, kCpuQueued; null otherwise).
  std::unique_ptr<DeviceStager> stager_;
  // The slot layout of a save: gathered device tensors first, together (see
  // DeviceStager::Gathers), then every other item in registration order.
  std::vector<proto::StagedItem> SlotLayout();
  // The registered tensors with bytes, as the stager sees them.
  std::vector<DeviceStager::Tensor> StagedTensors(
      const std::vector<proto::StagedItem>& layout,
      std::vector<size_t>* items) const;
  // Queues the stager's hashes of every tensor in `layout`, in runs of
  // `chunk_size`; `at[i]` is where item i's begin in stager_->hashes() (-1:
  // not hashed there).
  absl::Status QueueDeviceHashes(const std::vector<proto::StagedItem>& layout,
                                 uint32_t chunk_size, std::vector<int64_t>* at);
  std::vector<Registered> items_;
  std::thread copier_;  // the copy of the save in flight
  // One thread: StageComplete/AbortStage calls, in save order.
  std::unique_ptr<io::ThreadPool> handover_;
  // Most recently used first; touched only by the thread driving the
  // Checkpointer (the copier holds its own reference to the slot it fills).
  std::vector<std::shared_ptr<MappedSlot>> mapped_;
  // What the restore in progress read, reported to ckptd when it succeeds.
  struct RestoreReport {
    uint64_t memory_bytes = 0, disk_bytes = 0, peer_bytes = 0;
    uint32_t mismatches = 0, fallbacks = 0;
  };
  RestoreReport report_;  // touched only by the thread calling Restore
  // Tells ckptd this trainer is attached (its job is not idle), from the
  // first registration on: a Checkpointer that only asks questions (tools,
  // polls) is no trainer.
  void Attach();
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<DaemonSession> session_;
  // The failure watcher (WatchFailures).
  std::thread watcher_;
  std::atomic<bool> stop_watching_{false};
  std::vector<std::string> lost_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex mu_;
  const std::shared_ptr<FailureLog> failures_ = std::make_shared<FailureLog>();
  CheckpointerStats stats_ ABSL_GUARDED_BY(mu_);
};

// ckptd's default socket: $CKPT_SOCKET when set, else the calling uid's
// /tmp/ckpt-<uid>/ckptd.sock.
std::string DefaultSocketPath();

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_CHECKPOINTER_H_
