// SaveStager runs a Checkpointer's saves, each into the staging slot ckptd
// hands out: the slot's layout (device tensors that are gathered first, then
// every item in registration order), the copy (host threads, a fork of the
// trainer for host tensors, or the device's stream), the slot's chunk
// hashes, and the hand-over to ckptd (StageComplete, or AbortStage for a
// save that failed) in save order on a thread of its own, so that a save
// costs the trainer only its copy. Slot mappings are kept and reused across
// saves. One per Checkpointer. Not for use outside client/.
//
// Thread-safety: Save, Drain and Registered are called by the thread driving
// the Checkpointer; stats() from any thread.
#ifndef CKPT_CLIENT_SAVE_STAGER_H_
#define CKPT_CLIENT_SAVE_STAGER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/checkpointer.h"
#include "client/device_stager.h"
#include "client/fork_snapshot.h"
#include "client/restore_context.h"
#include "io/file_system.h"
#include "io/thread_pool.h"
#include "io/unique_fd.h"
#include "kernels/device.h"
#include "proto/daemon.pb.h"

namespace ckpt::client {

class SaveStager {
 public:
  // What the saves work on, the Checkpointer's; `stager` is null for a
  // device without streams (host memory).
  struct Context {
    const CheckpointerOptions& options;
    std::shared_ptr<CheckpointerRpc> rpc;
    kernels::Device& device;
    DeviceStager* stager;
    std::vector<RegisteredItem>& items;
    std::shared_ptr<FailureLog> failures;
  };
  explicit SaveStager(Context ctx);
  // Waits for the copy in flight and hands over every save still queued.
  ~SaveStager();
  SaveStager(const SaveStager&) = delete;
  SaveStager& operator=(const SaveStager&) = delete;

  // Starts saving `step` (see Checkpointer::SaveAsync).
  absl::StatusOr<std::shared_ptr<SaveHandle>> Save(uint64_t step);
  // Waits for the copy in flight and every queued hand-over.
  void Drain();
  // An item was registered: the mappings under the tensors are inspected
  // again before the next fork.
  void Registered() { inspected_ = false; }
  CheckpointerStats stats() const;

 private:
  struct MappedSlot {
    std::unique_ptr<io::MappedFile> file;
    // Declared after `file`: unpinned before the memory is unmapped.
    std::unique_ptr<kernels::HostRegistration> pin;
  };
  // One save on its way into its slot, from Save to its hand-over: where the
  // bytes go and what the copier thread needs to finish the copy.
  struct PendingSave {
    uint64_t step = 0;
    std::vector<proto::StagedItem> layout;  // as SlotLayout placed the items
    std::string slot_path;
    // A fork writes the slot through `fd` (the tensors are `regions`); else
    // the slot is mapped at `base`.
    bool fork = false;
    io::UniqueFd fd;
    std::vector<HostRegion> regions;
    std::shared_ptr<MappedSlot> slot;
    uint8_t* base = nullptr;
    // The chunk size the slot is hashed in (StagedItem.chunk_xxh3); 0: not.
    uint32_t chunk_size = 0;
    // A device with streams: the event after its copies (null: none
    // queued), and where each item's chunk hashes are in `device_hashes`
    // (-1: not hashed on the device).
    std::shared_ptr<kernels::Event> copied;
    std::vector<int64_t> device_at;
    const uint64_t* device_hashes = nullptr;
    // Items whose chunks were hashed as they were copied (host tensors).
    std::vector<bool> hashed_in_copy;
    std::shared_ptr<SaveHandle> handle;
  };

  // The slot layout with the byte items sized as they are now, and the slot
  // size it needs.
  std::vector<proto::StagedItem> SizedLayout();
  std::vector<proto::StagedItem> SlotLayout();
  static uint64_t SlotBytes(const std::vector<proto::StagedItem>& layout);
  // Asks ckptd for the slot.
  absl::StatusOr<proto::BeginStageResponse> BeginStage(uint64_t step,
                                                       uint64_t bytes);
  // Opens the slot: for a fork, a descriptor to write it; else mapped.
  absl::Status OpenSlot(PendingSave& save,
                        const proto::BeginStageResponse& slot);
  // Whether this save's host tensors (`regions`) are captured by a fork;
  // records why not in stats_.fork_refused.
  bool ShouldFork(const std::vector<HostRegion>& regions);
  // The mapping of the slot file at `path` (`bytes` long): the cached one
  // when the daemon handed out a slot file this process mapped before, else
  // a fresh mapping, pinned for the device.
  absl::StatusOr<std::shared_ptr<MappedSlot>> MapSlot(const std::string& path,
                                                      uint64_t bytes);
  // Copies the byte items into the slot now (the caller may change them as
  // soon as Save returns).
  absl::Status CaptureByteItems(PendingSave& save);
  // Host tensors: copies them into the slot on host threads, hashing their
  // chunks as it goes when the save is hashed (`hashed_in_copy`).
  void CopyHostTensors(PendingSave& save);
  // Queues the tensors' copies into the slot at `base` on the device's
  // stream.
  absl::Status CopyTensors(const std::vector<proto::StagedItem>& layout,
                           uint8_t* base);
  // The registered tensors with bytes, as the device stager sees them.
  std::vector<DeviceStager::Tensor> StagedTensors(
      const std::vector<proto::StagedItem>& layout,
      std::vector<size_t>* items) const;
  // A device with streams: queues the tensors' copies and chunk hashes, and
  // the event the compute stream and the handle wait for.
  absl::Status QueueDeviceCopies(PendingSave& save);
  // Queues the device stager's hashes of every tensor in `layout`, in runs
  // of `chunk_size`; `at[i]` is where item i's begin in its hashes() (-1:
  // not hashed there).
  absl::Status QueueDeviceHashes(const std::vector<proto::StagedItem>& layout,
                                 uint32_t chunk_size, std::vector<int64_t>* at);
  // On the copier thread: the copy (a fork, host threads, or waiting for the
  // device), the slot's hashes, the stats, then the hand-over queued.
  void FinishCopy(const std::shared_ptr<PendingSave>& save);
  absl::Status CopyByFork(PendingSave& save, bool* forked);
  absl::Status CopyInProcess(PendingSave& save);
  void CountSave(const PendingSave& save, const absl::Status& status,
                 bool forked);
  // Tells ckptd that the copy of `step` is done (StageComplete) or failed
  // (AbortStage), and finishes the handle. Runs on `handover_`.
  void HandOver(const std::shared_ptr<SaveHandle>& handle, uint64_t step,
                const std::vector<proto::StagedItem>& layout,
                absl::Status status);
  // Gives back the slot of a save that failed before its copy started (the
  // abort is queued behind earlier hand-overs); returns the error to report.
  absl::Status Abandon(uint64_t step, absl::Status status);

  const Context ctx_;
  // kFork: the mappings under the registered tensors
  // (client/fork_snapshot.h), inspected at the first save after a
  // registration. Touched only by the thread driving saves.
  bool inspected_ = false;
  ForkInspection inspection_;
  // Most recently used first; touched only by the thread driving saves (the
  // copier holds its own reference to the slot it fills).
  std::vector<std::shared_ptr<MappedSlot>> mapped_;
  mutable absl::Mutex mu_;
  CheckpointerStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread copier_;  // the copy of the save in flight
  // One thread: StageComplete/AbortStage calls, in save order. Declared
  // last: destroyed first, finishing the hand-overs still queued.
  std::unique_ptr<io::ThreadPool> handover_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_SAVE_STAGER_H_
