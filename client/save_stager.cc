#include "client/save_stager.h"

#include <cstring>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/checkpointer.h"
#include "client/checkpointer_internal.h"
#include "client/parallel_copy.h"
#include "client/subscriber.h"
#include "io/errno_status.h"
#include "io/file_system.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/format.h"
#include "snapshot/names.h"

namespace ckpt::client {

namespace {

// Items start cache-line aligned in the slot, and page aligned from
// snapshot::kMinInPlaceBytes on: ckptd then writes their chunks to disk from
// the slot itself, with O_DIRECT and no copy.
constexpr uint64_t kItemAlignment = 64;
uint64_t ItemAlignment(uint64_t raw_size) {
  return raw_size >= snapshot::kMinInPlaceBytes ? snapshot::kAlignment
                                                : kItemAlignment;
}

// Hashes each `chunk_size` run of every staged item in the slot at `base`
// (StagedItem.chunk_xxh3), on several threads, but for the items hashed
// already: as they were copied (`hashed_in_copy[i]`), or on the device (item
// i's hashes are at device_hashes + device_at[i] when that is not -1).
void HashStagedChunks(const uint8_t* base, uint32_t chunk_size,
                      std::vector<proto::StagedItem>* layout,
                      const std::vector<bool>& hashed_in_copy,
                      const std::vector<int64_t>& device_at,
                      const uint64_t* device_hashes) {
  struct Run {
    const uint8_t* data;
    uint64_t bytes;
    uint64_t* xxh3;
  };
  std::vector<Run> runs;
  uint64_t total = 0;
  for (size_t i = 0; i < layout->size(); ++i) {
    if (i < hashed_in_copy.size() && hashed_in_copy[i]) continue;
    proto::StagedItem& staged = (*layout)[i];
    const uint64_t n = staged.item().raw_size();
    const int count = static_cast<int>(snapshot::ChunkCount(n, chunk_size));
    staged.set_chunk_size(chunk_size);
    staged.mutable_chunk_xxh3()->Resize(count, 0);
    uint64_t* out = staged.mutable_chunk_xxh3()->mutable_data();
    if (i < device_at.size() && device_at[i] >= 0) {
      std::copy_n(device_hashes + device_at[i], count, out);
      continue;
    }
    for (uint64_t off = 0, k = 0; off < n; off += chunk_size, ++k) {
      runs.push_back({base + staged.slot_offset() + off,
                      std::min<uint64_t>(chunk_size, n - off), out + k});
    }
    total += n;
  }
  ParallelFor(runs.size(), CopyThreadsFor(total), [&runs](size_t i) {
    *runs[i].xxh3 =
        snapshot::Checksum(absl::MakeConstSpan(runs[i].data, runs[i].bytes));
  });
}

}  // namespace

void SaveHandle::Copied(absl::Status status) {
  absl::MutexLock lock(&mu_);
  copied_ = true;
  copy_status_ = std::move(status);
}

void SaveHandle::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (!copied_) {
    copied_ = true;
    copy_status_ = status;
  }
  done_ = true;
  status_ = std::move(status);
}

absl::Status SaveHandle::WaitStaged() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&copied_));
  return copy_status_;
}

bool SaveHandle::Staged() {
  absl::MutexLock lock(&mu_);
  return copied_;
}

absl::Status SaveHandle::OrderStream(void* stream) {
  if (copied_event_ == nullptr) return WaitStaged();
  return device_->StreamWaitEvent(stream, *copied_event_);
}

absl::Status SaveHandle::WaitCommitted(proto::Tier tier,
                                       absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    RETURN_IF_ERROR(status_);
  }
  proto::WaitCommittedRequest req;
  req.set_job(job_);
  req.set_step(step_);
  req.set_tier(tier);
  req.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
  proto::WaitCommittedResponse resp;
  absl::Status s = rpc_->Call(
      &proto::CkptDaemon::Stub::WaitCommitted, req, &resp,
      absl::StrCat("waiting for step ", step_, " to commit"), timeout);
  if (!s.ok()) failures_->Record(s);
  return s;
}

absl::StatusOr<proto::VersionRecord> SaveHandle::Publish(
    const std::string& topic, const std::vector<std::string>& items,
    const std::string& cast, absl::Duration timeout) {
  RETURN_IF_ERROR(WaitCommitted(proto::TIER_LOCAL_DISK, timeout));
  proto::PublishRequest request;
  request.set_job(job_);
  request.set_step(step_);
  request.set_topic(topic);
  for (const std::string& glob : items) request.add_items(glob);
  request.set_cast(cast);
  return client::Publish(rpc_->socket_path(), request);
}

bool SaveStager::ShouldFork(const std::vector<HostRegion>& regions) {
  if (ctx_.options.host_snapshot != HostSnapshot::kFork || regions.empty() ||
      !ctx_.device.host_resident() || ctx_.device.queues_copies()) {
    return false;
  }
  if (!inspected_) {
    absl::StatusOr<ForkInspection> inspection = Inspect(regions);
    if (!inspection.ok()) {
      absl::MutexLock lock(&mu_);
      stats_.fork_refused = inspection.status().ToString();
      return false;
    }
    inspection_ = *std::move(inspection);
    inspected_ = true;
  }
  absl::MutexLock lock(&mu_);
  stats_.fork_refused = inspection_.unsafe;
  stats_.huge_page_share = inspection_.huge_page_share;
  return inspection_.unsafe.empty();
}

std::vector<proto::StagedItem> SaveStager::SlotLayout() {
  std::vector<proto::StagedItem> layout(ctx_.items.size());
  uint64_t offset = 0;
  auto place = [&](size_t i) {
    const proto::Item& item = ctx_.items[i].item;
    *layout[i].mutable_item() = item;
    layout[i].set_rank_local(ctx_.items[i].rank_local);
    offset = io::AlignUp(offset, ItemAlignment(item.raw_size()));
    layout[i].set_slot_offset(offset);
    offset = io::AlignUp(offset + item.raw_size(), kItemAlignment);
  };
  std::vector<bool> placed(ctx_.items.size(), false);
  for (size_t i = 0; ctx_.stager != nullptr && i < ctx_.items.size(); ++i) {
    if (ctx_.items[i].is_tensor() &&
        ctx_.stager->Gathers(ctx_.items[i].item.raw_size())) {
      place(i);
      placed[i] = true;
    }
  }
  for (size_t i = 0; i < ctx_.items.size(); ++i) {
    if (!placed[i]) place(i);
  }
  return layout;
}

std::vector<DeviceStager::Tensor> SaveStager::StagedTensors(
    const std::vector<proto::StagedItem>& layout,
    std::vector<size_t>* items) const {
  std::vector<DeviceStager::Tensor> tensors;
  for (size_t i = 0; i < ctx_.items.size(); ++i) {
    if (!ctx_.items[i].is_tensor() || layout[i].item().raw_size() == 0)
      continue;
    tensors.push_back({ctx_.items[i].tensor, layout[i].item().raw_size(),
                       layout[i].slot_offset()});
    if (items != nullptr) items->push_back(i);
  }
  return tensors;
}

absl::Status SaveStager::QueueDeviceHashes(
    const std::vector<proto::StagedItem>& layout, uint32_t chunk_size,
    std::vector<int64_t>* at) {
  std::vector<size_t> items;
  const std::vector<DeviceStager::Tensor> tensors =
      StagedTensors(layout, &items);
  if (tensors.empty()) return absl::OkStatus();
  std::vector<uint64_t> first;
  RETURN_IF_ERROR(ctx_.stager->QueueHashes(tensors, chunk_size, &first));
  for (size_t j = 0; j < items.size(); ++j) {
    (*at)[items[j]] = static_cast<int64_t>(first[j]);
  }
  return absl::OkStatus();
}

SaveStager::SaveStager(Context ctx)
    : ctx_(std::move(ctx)), handover_(std::make_unique<io::ThreadPool>(1)) {}

SaveStager::~SaveStager() {
  if (copier_.joinable()) copier_.join();
  handover_.reset();  // finishes the hand-overs still queued
}

void SaveStager::Drain() {
  if (copier_.joinable()) copier_.join();
  absl::Notification drained;
  handover_->Schedule([&drained] { drained.Notify(); });
  drained.WaitForNotification();
}

CheckpointerStats SaveStager::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<std::shared_ptr<SaveHandle>> SaveStager::Save(uint64_t step) {
  if (copier_.joinable())
    copier_.join();  // one copy at a time: slots are filled in order
  auto save = std::make_shared<PendingSave>();
  save->step = step;
  save->layout = SizedLayout();
  ASSIGN_OR_RETURN(const proto::BeginStageResponse slot,
                   BeginStage(step, SlotBytes(save->layout)));
  CKPT_KILL_POINT("client.after_begin_stage");
  save->slot_path = slot.slot_path();
  if (absl::Status s = OpenSlot(*save, slot); !s.ok()) return Abandon(step, s);
  if (absl::Status s = CaptureByteItems(*save); !s.ok()) {
    return Abandon(step, s);
  }
  // A device with streams gets its copies queued here, before SaveAsync
  // returns, so that the trainer's next kernels can be ordered after them;
  // the copier thread only waits. The CPU device copies on the copier thread.
  if (ctx_.device.queues_copies()) {
    if (absl::Status s = QueueDeviceCopies(*save); !s.ok()) {
      // Copies already queued may still be writing into the slot: let them
      // finish before the daemon gets it back.
      (void)ctx_.device.Synchronize();
      return Abandon(step, s);
    }
  }
  save->handle = std::shared_ptr<SaveHandle>(
      new SaveHandle(ctx_.rpc, ctx_.failures, ctx_.options.job, step));
  if (save->copied != nullptr) {
    save->handle->device_ = &ctx_.device;
    save->handle->copied_event_ = save->copied;
  }
  std::shared_ptr<SaveHandle> handle = save->handle;
  try {
    copier_ = std::thread([this, save] { FinishCopy(save); });
  } catch (const std::system_error& e) {
    // No thread to be had (a thread limit under load): the copy runs here.
    CKPT_LOG_WARN("saving step {}: copying on the calling thread: {}", step,
                  e.what());
    FinishCopy(save);
  }
  return handle;
}

std::vector<proto::StagedItem> SaveStager::SizedLayout() {
  // Byte items are sized now (see ItemAlignment).
  for (RegisteredItem& r : ctx_.items) {
    if (r.bytes != nullptr) r.item.set_raw_size(r.bytes->size());
  }
  return SlotLayout();
}

uint64_t SaveStager::SlotBytes(const std::vector<proto::StagedItem>& layout) {
  uint64_t end = 0;
  for (const proto::StagedItem& staged : layout) {
    end = std::max(end,
                   io::AlignUp(staged.slot_offset() + staged.item().raw_size(),
                               kItemAlignment));
  }
  return end;
}

absl::StatusOr<proto::BeginStageResponse> SaveStager::BeginStage(
    uint64_t step, uint64_t bytes) {
  proto::BeginStageRequest req;
  req.mutable_shard()->set_job(ctx_.options.job);
  req.mutable_shard()->set_step(step);
  req.mutable_shard()->set_rank(ctx_.options.rank);
  req.set_world_size(ctx_.options.world_size);
  req.set_bytes(bytes);
  proto::BeginStageResponse resp;
  absl::Status s = ctx_.rpc->Call(&proto::CkptDaemon::Stub::BeginStage, req,
                                  &resp, absl::StrCat("saving step ", step));
  if (!s.ok()) {
    ctx_.failures->Record(s);
    return s;
  }
  return resp;
}

absl::Status SaveStager::OpenSlot(PendingSave& save,
                                  const proto::BeginStageResponse& slot) {
  for (size_t i = 0; i < ctx_.items.size(); ++i) {
    if (!ctx_.items[i].is_tensor() || ctx_.items[i].item.raw_size() == 0)
      continue;
    save.regions.push_back({ctx_.items[i].tensor, ctx_.items[i].item.raw_size(),
                            save.layout[i].slot_offset()});
  }
  // A fork writes the slot file through a descriptor: the slot is not mapped
  // here (mapping a fresh 1 GiB slot costs 0.1-0.3 s of page-table work).
  save.fork = ShouldFork(save.regions);
  if (save.fork) {
    ASSIGN_OR_RETURN(save.fd, io::DefaultFileSystem()->OpenForWritingInPlace(
                                  slot.slot_path()));
  } else {
    ASSIGN_OR_RETURN(save.slot, MapSlot(slot.slot_path(), slot.slot_bytes()));
    save.base = save.slot->file->data();
  }
  // The chunk size of ckptd's shards: what the slot is hashed in runs of.
  save.chunk_size =
      ctx_.options.hash_staged_chunks && !save.fork ? slot.chunk_size() : 0;
  save.device_at.assign(save.layout.size(), -1);
  return absl::OkStatus();
}

absl::Status SaveStager::CaptureByteItems(PendingSave& save) {
  // Byte items are captured now: the caller may change them as soon as
  // SaveAsync returns.
  std::vector<HostRegion> byte_items;
  for (size_t i = 0; i < ctx_.items.size(); ++i) {
    if (ctx_.items[i].bytes == nullptr) continue;
    const uint64_t at = save.layout[i].slot_offset();
    if (save.fork) {
      byte_items.push_back(
          {ctx_.items[i].bytes->data(), ctx_.items[i].bytes->size(), at});
    } else {
      std::memcpy(save.base + at, ctx_.items[i].bytes->data(),
                  ctx_.items[i].bytes->size());
    }
  }
  if (!save.fork) return absl::OkStatus();
  const int err = WriteRegions(save.fd.get(), byte_items);
  return err == 0 ? absl::OkStatus() : io::ErrnoToStatus(err, save.slot_path);
}

void SaveStager::CopyHostTensors(PendingSave& save) {
  // Plain memory copies, spread over several threads; with chunk hashes,
  // each chunk hashed block by block as it is copied (one pass).
  std::vector<CopyRegion> copies;
  std::vector<HashedCopyRegion> hashed;
  size_t total = 0;
  save.hashed_in_copy.assign(save.layout.size(), false);
  for (size_t i = 0; i < ctx_.items.size(); ++i) {
    const RegisteredItem& r = ctx_.items[i];
    if (!r.is_tensor() || r.item.raw_size() == 0) continue;
    uint8_t* dst = save.base + save.layout[i].slot_offset();
    const uint64_t n = r.item.raw_size();
    total += n;
    if (save.chunk_size == 0) {
      copies.push_back({r.tensor, dst, n});
      continue;
    }
    proto::StagedItem& staged = save.layout[i];
    staged.set_chunk_size(save.chunk_size);
    staged.mutable_chunk_xxh3()->Resize(
        static_cast<int>(snapshot::ChunkCount(n, save.chunk_size)), 0);
    hashed.push_back(
        {r.tensor, dst, n, staged.mutable_chunk_xxh3()->mutable_data()});
    save.hashed_in_copy[i] = true;
  }
  if (hashed.empty()) {
    ParallelHostCopy(copies, CopyThreadsFor(total));
  } else {
    ParallelCopyAndHash(hashed, save.chunk_size, CopyThreadsFor(total));
  }
  for (size_t i = 0; i < copies.size() + hashed.size(); ++i) {
    CKPT_KILL_POINT("client.item_copied");
  }
}

absl::Status SaveStager::CopyTensors(
    const std::vector<proto::StagedItem>& layout, uint8_t* base) {
  absl::Status queued =
      ctx_.stager->QueueCopies(StagedTensors(layout, nullptr), base);
  const DeviceStager::Stats& stats = ctx_.stager->stats();
  absl::MutexLock lock(&mu_);
  stats_.tensors_gathered = stats.tensors_gathered;
  stats_.gather_launches = stats.gather_launches;
  stats_.gather_refused = stats.gather_refused;
  return queued;
}

absl::Status SaveStager::QueueDeviceCopies(PendingSave& save) {
  RETURN_IF_ERROR(ctx_.device.WaitForStream(ctx_.options.compute_stream));
  RETURN_IF_ERROR(CopyTensors(save.layout, save.base));
  // The tensors' chunk hashes, taken on the device behind their copies (of
  // the bytes copied), so the host hashes only the byte items.
  if (save.chunk_size > 0) {
    absl::Status hashed =
        QueueDeviceHashes(save.layout, save.chunk_size, &save.device_at);
    if (hashed.ok()) {
      save.device_hashes = ctx_.stager->hashes();
    } else {
      CKPT_LOG_WARN("saving step {}: the host hashes the slot instead: {}",
                    save.step, hashed.ToString());
      std::fill(save.device_at.begin(), save.device_at.end(), -1);
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Event> event,
                   ctx_.device.RecordEvent());
  if (ctx_.options.order_compute_stream) {
    RETURN_IF_ERROR(
        ctx_.device.StreamWaitEvent(ctx_.options.compute_stream, *event));
  }
  save.copied = std::move(event);
  return absl::OkStatus();
}

void SaveStager::FinishCopy(const std::shared_ptr<PendingSave>& save) {
  bool forked = false;
  absl::Status status =
      save->fork ? CopyByFork(*save, &forked) : CopyInProcess(*save);
  CountSave(*save, status, forked);
  // The hand-over runs on its own thread, in save order, so the next
  // SaveAsync waits only for this copy, not for the daemon's bookkeeping.
  handover_->Schedule([this, save, status = std::move(status)]() mutable {
    HandOver(save->handle, save->step, save->layout, std::move(status));
  });
}

absl::Status SaveStager::CopyByFork(PendingSave& save, bool* forked) {
  // The fork runs on the copier thread: the child dies with the thread that
  // forked it, and this one lives until the child is done.
  absl::StatusOr<std::unique_ptr<ForkedCopy>> child =
      ForkedCopy::Start(save.fd.get(), save.regions);
  absl::Status status;
  if (child.ok()) {
    *forked = true;
    save.handle->Copied(absl::OkStatus());  // captured: training may go on
    CKPT_KILL_POINT("client.forked");
    status = (*child)->Wait();
    if (status.ok()) CKPT_KILL_POINT("client.item_copied");
  } else {
    // No fork (out of memory, say): the same bytes, written here.
    CKPT_LOG_WARN("saving step {}: writing instead of forking: {}", save.step,
                  child.status().ToString());
    const int err = WriteRegions(save.fd.get(), save.regions);
    status =
        err == 0 ? absl::OkStatus() : io::ErrnoToStatus(err, save.slot_path);
    save.handle->Copied(status);
  }
  save.fd.Reset();
  return status;
}

absl::Status SaveStager::CopyInProcess(PendingSave& save) {
  absl::Status status;
  if (save.copied != nullptr) {
    status = save.copied->Wait();
  } else if (ctx_.device.host_resident() && !ctx_.device.queues_copies()) {
    CopyHostTensors(save);
  } else {
    status = CopyTensors(save.layout, save.base);
  }
  save.handle->Copied(status);
  // The trainer goes on; what was not hashed as it was copied (byte items,
  // a device's tensors the device did not hash) is hashed meanwhile, so that
  // ckptd's persist of a raw chunk only writes it.
  if (status.ok() && save.chunk_size > 0) {
    HashStagedChunks(save.base, save.chunk_size, &save.layout,
                     save.hashed_in_copy, save.device_at, save.device_hashes);
  }
  return status;
}

void SaveStager::CountSave(const PendingSave& save, const absl::Status& status,
                           bool forked) {
  absl::MutexLock lock(&mu_);
  if (save.copied == nullptr && !save.regions.empty()) {
    ++(forked ? stats_.saves_forked : stats_.saves_copied);
  }
  for (size_t i = 0; status.ok() && i < save.device_at.size(); ++i) {
    if (save.device_at[i] >= 0) {
      stats_.chunks_hashed_on_device += save.layout[i].chunk_xxh3_size();
    }
  }
}

void SaveStager::HandOver(const std::shared_ptr<SaveHandle>& handle,
                          uint64_t step,
                          const std::vector<proto::StagedItem>& layout,
                          absl::Status status) {
  proto::ShardKey key;
  key.set_job(ctx_.options.job);
  key.set_step(step);
  key.set_rank(ctx_.options.rank);
  CKPT_KILL_POINT("client.before_stage_complete");
  if (status.ok()) {
    proto::StageCompleteRequest done;
    *done.mutable_shard() = key;
    for (const auto& staged : layout) *done.add_items() = staged;
    proto::StageCompleteResponse ok;
    status = ctx_.rpc->Call(&proto::CkptDaemon::Stub::StageComplete, done, &ok,
                            absl::StrCat("staging step ", step));
  } else {
    proto::AbortStageRequest abort;
    *abort.mutable_shard() = key;
    proto::AbortStageResponse ignored;
    (void)ctx_.rpc->Call(&proto::CkptDaemon::Stub::AbortStage, abort, &ignored,
                         "abort");
  }
  CKPT_KILL_POINT("client.after_stage_complete");
  if (!status.ok()) ctx_.failures->Record(status);
  handle->Finish(status);
}

absl::Status SaveStager::Abandon(uint64_t step, absl::Status status) {
  status = absl::Status(status.code(), absl::StrCat("saving step ", step, ": ",
                                                    status.message()));
  // In save order with the hand-overs before it; the abort gives the slot back.
  auto handle = std::shared_ptr<SaveHandle>(
      new SaveHandle(ctx_.rpc, ctx_.failures, ctx_.options.job, step));
  handover_->Schedule(
      [this, handle, step, status] { HandOver(handle, step, {}, status); });
  return status;
}

absl::StatusOr<std::shared_ptr<SaveStager::MappedSlot>> SaveStager::MapSlot(
    const std::string& path, uint64_t bytes) {
  io::FileSystem* fs = io::DefaultFileSystem();
  ASSIGN_OR_RETURN(io::FileId id, fs->GetFileId(path));
  // Slots the daemon deleted are dropped first: their memory would live on in
  // our mapping, outside the daemon's budget.
  std::shared_ptr<MappedSlot> found;
  for (auto it = mapped_.begin(); it != mapped_.end();) {
    absl::StatusOr<bool> linked = (*it)->file->Linked();
    if (!linked.ok() || !*linked) {
      it = mapped_.erase(it);
      continue;
    }
    if ((*it)->file->id() == id && (*it)->file->size() == bytes) {
      found = *it;
      it = mapped_.erase(it);
      continue;
    }
    ++it;
  }
  if (found != nullptr) {
    absl::MutexLock lock(&mu_);
    ++stats_.slots_reused;
  } else {
    auto slot = std::make_shared<MappedSlot>();
    ASSIGN_OR_RETURN(slot->file, fs->MapFile(path, {.populate = true}));
    if (slot->file->size() != bytes || !(slot->file->id() == id)) {
      return absl::DataLossError(
          absl::StrCat("staging slot ", path, " changed while being mapped (",
                       slot->file->size(), " bytes, expected ", bytes, ")"));
    }
    ASSIGN_OR_RETURN(slot->pin,
                     ctx_.device.RegisterHost(slot->file->data(), bytes));
    found = std::move(slot);
    absl::MutexLock lock(&mu_);
    ++stats_.slots_mapped;
  }
  mapped_.insert(mapped_.begin(), found);
  if (mapped_.size() > static_cast<size_t>(ctx_.options.mapped_slots)) {
    mapped_.resize(ctx_.options.mapped_slots);
  }
  return found;
}

}  // namespace ckpt::client
