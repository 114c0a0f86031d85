#include "client/checkpointer.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/daemon_admin.h"
#include "client/parallel_copy.h"
#include "daemon/bulk_transfer.h"
#include "io/errno_status.h"
#include "io/file_system.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/box.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/dtype.h"
#include "snapshot/format.h"
#include "snapshot/names.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_stream.h"

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

}  // namespace

std::string DefaultSocketPath() {
  return absl::StrCat("/tmp/ckpt-", ::geteuid(), "/ckptd.sock");
}

struct Checkpointer::MappedSlot {
  std::unique_ptr<io::MappedFile> file;
  // Declared after `file`: unpinned before the memory is unmapped.
  std::unique_ptr<kernels::HostRegistration> pin;
};

struct Checkpointer::Registered {
  proto::Item item;
  void* tensor = nullptr;        // tensors (null for an empty one)
  std::string* bytes = nullptr;  // byte items
  bool is_tensor() const { return bytes == nullptr; }
};

// The gRPC stub and the deadline every call gets.
class CheckpointerRpc {
 public:
  CheckpointerRpc(std::shared_ptr<grpc::Channel> channel,
                  absl::Duration timeout, std::string socket_path)
      : stub_(proto::CkptDaemon::NewStub(std::move(channel))),
        timeout_(timeout),
        socket_path_(std::move(socket_path)) {}

  template <typename Request, typename Response, typename Method>
  absl::Status Call(Method method, const Request& request, Response* response,
                    absl::string_view what,
                    absl::Duration extra = absl::ZeroDuration()) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_ + extra));
    return FromGrpc((stub_.get()->*method)(&context, request, response), what,
                    socket_path_);
  }

 private:
  std::unique_ptr<proto::CkptDaemon::Stub> stub_;
  const absl::Duration timeout_;
  const std::string socket_path_;
};

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

Checkpointer::Checkpointer(const CheckpointerOptions& options)
    : options_(options),
      host_snapshot_(options.host_snapshot),
      device_(kernels::NewCpuDevice()),
      handover_(std::make_unique<io::ThreadPool>(1)) {}

Checkpointer::~Checkpointer() {
  stop_watching_ = true;
  if (watcher_.joinable()) watcher_.join();
  if (copier_.joinable()) copier_.join();
  handover_.reset();  // finishes the hand-overs still queued
}

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Connect(
    const CheckpointerOptions& given) {
  CheckpointerOptions options = given;
  if (options.socket_path.empty()) options.socket_path = DefaultSocketPath();
  RETURN_IF_ERROR(snapshot::ValidateJobId(options.job));
  if (options.world_size == 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", options.rank, " is outside world size ", options.world_size));
  }
  // Say clearly when the daemon belongs to someone else: it would refuse us
  // anyway.
  struct stat st;
  if (::stat(options.socket_path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::UnavailableError(
          absl::StrCat("ckptd socket ", options.socket_path,
                       " does not exist (is ckptd running, as this user?)"));
    }
    return io::ErrnoToStatus(
        errno, absl::StrCat("ckptd socket ", options.socket_path,
                            " (is ckptd running, as this user?)"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("ckptd socket ", options.socket_path, " belongs to uid ",
                     st.st_uid, " but this process runs as uid ", ::geteuid(),
                     "; ckptd serves only its own user"));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // Reconnect quickly after a daemon restart: saves fail while it is down, then
  // work again.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (options.mapped_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mapped_slots must be at least 1, not ", options.mapped_slots));
  }
  if (const char* mode = std::getenv("CKPT_HOST_SNAPSHOT")) {
    const std::string m = mode;
    if (m == "copy") {
      options.host_snapshot = HostSnapshot::kCopy;
    } else if (m == "fork") {
      options.host_snapshot = HostSnapshot::kFork;
    } else if (!m.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CKPT_HOST_SNAPSHOT is \"", m, "\"; it must be copy or fork"));
    }
  }
  std::unique_ptr<Checkpointer> ckpt(new Checkpointer(options));
  if (options.device == DeviceKind::kCuda) {
    absl::StatusOr<std::unique_ptr<kernels::Device>> cuda =
        kernels::NewCudaDevice(options.cuda_device);
    if (!cuda.ok()) {
      return absl::Status(
          cuda.status().code(),
          absl::StrCat("rank ", options.rank, ": CUDA device ",
                       options.cuda_device, ": ", cuda.status().message()));
    }
    ckpt->device_ = *std::move(cuda);
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(absl::StrCat("unix://", options.socket_path),
                                grpc::InsecureChannelCredentials(), args);
  ckpt->rpc_ =
      std::make_shared<Rpc>(channel, options.rpc_timeout, options.socket_path);
  // A first call proves the daemon accepted us (it drops connections of other
  // uids).
  proto::LatestCommittedRequest probe;
  probe.set_job(options.job);
  probe.set_tier(proto::TIER_LOCAL_DISK);
  proto::LatestCommittedResponse resp;
  RETURN_IF_ERROR(
      ckpt->rpc_->Call(&proto::CkptDaemon::Stub::LatestCommitted, probe, &resp,
                       absl::StrCat("ckptd at ", options.socket_path)));
  ckpt->channel_ = std::move(channel);
  return ckpt;
}

absl::Status Checkpointer::CheckNewName(const std::string& name) const {
  RETURN_IF_ERROR(snapshot::ValidateItemName(name));
  for (const Registered& other : items_) {
    if (other.item.name() == name) {
      return absl::AlreadyExistsError(
          absl::StrCat("\"", name, "\" is already registered"));
    }
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::RegisterTensor(const std::string& name,
                                          proto::DType dtype, void* data,
                                          std::vector<int64_t> global_shape,
                                          std::vector<int64_t> box_offset,
                                          std::vector<int64_t> box_length) {
  Registered r;
  r.item.set_name(name);
  r.item.set_kind(proto::ITEM_KIND_TENSOR);
  r.item.set_dtype(dtype);
  for (int64_t dim : global_shape) r.item.add_global_shape(dim);
  for (int64_t off : box_offset) r.item.add_box_offset(off);
  for (int64_t len : box_length) r.item.add_box_length(len);
  ASSIGN_OR_RETURN(uint64_t size, snapshot::ValidateTensorBox(r.item));
  r.item.set_raw_size(size);
  r.tensor = data;
  RETURN_IF_ERROR(CheckNewName(name));
  if (device_->host_resident() && host_snapshot_ == HostSnapshot::kFork &&
      data != nullptr) {
    AdviseHugePages(data, size);
  }
  items_.push_back(std::move(r));
  inspected_ = false;
  Attach();
  return absl::OkStatus();
}

void Checkpointer::Attach() {
  if (session_ == nullptr) {
    session_ =
        std::make_unique<DaemonSession>(channel_, options_.job, options_.rank);
  }
}

absl::Status Checkpointer::RegisterBytes(const std::string& name,
                                         std::string* value) {
  RETURN_IF_ERROR(CheckNewName(name));
  Registered r;
  r.item.set_name(name);
  r.item.set_kind(proto::ITEM_KIND_BYTES);
  r.bytes = value;
  items_.push_back(std::move(r));
  Attach();
  return absl::OkStatus();
}

absl::Status Checkpointer::LastSaveError() { return failures_->Take(); }

bool Checkpointer::ShouldFork(const std::vector<HostRegion>& regions) {
  if (host_snapshot_ != HostSnapshot::kFork || regions.empty() ||
      !device_->host_resident() || device_->queues_copies()) {
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

absl::StatusOr<std::shared_ptr<SaveHandle>> Checkpointer::SaveAsync(
    uint64_t step) {
  if (copier_.joinable())
    copier_.join();  // one copy at a time: slots are filled in order
  // The slot layout (see ItemAlignment); byte items are sized now.
  std::vector<proto::StagedItem> layout;
  uint64_t offset = 0;
  for (Registered& r : items_) {
    if (r.bytes != nullptr) r.item.set_raw_size(r.bytes->size());
    proto::StagedItem staged;
    *staged.mutable_item() = r.item;
    offset = io::AlignUp(offset, ItemAlignment(r.item.raw_size()));
    staged.set_slot_offset(offset);
    offset = io::AlignUp(offset + r.item.raw_size(), kItemAlignment);
    layout.push_back(std::move(staged));
  }
  proto::BeginStageRequest req;
  req.mutable_shard()->set_job(options_.job);
  req.mutable_shard()->set_step(step);
  req.mutable_shard()->set_rank(options_.rank);
  req.set_world_size(options_.world_size);
  req.set_bytes(offset);
  proto::BeginStageResponse resp;
  absl::Status s = rpc_->Call(&proto::CkptDaemon::Stub::BeginStage, req, &resp,
                              absl::StrCat("saving step ", step));
  if (!s.ok()) {
    failures_->Record(s);
    return s;
  }
  CKPT_KILL_POINT("client.after_begin_stage");
  std::vector<HostRegion> regions;
  for (size_t i = 0; i < items_.size(); ++i) {
    if (!items_[i].is_tensor() || items_[i].item.raw_size() == 0) continue;
    regions.push_back(
        {items_[i].tensor, items_[i].item.raw_size(), layout[i].slot_offset()});
  }
  // A fork writes the slot file through a descriptor: the slot is not mapped
  // here (mapping a fresh 1 GiB slot costs 0.1-0.3 s of page-table work).
  const bool fork = ShouldFork(regions);
  int fd = -1;
  std::shared_ptr<MappedSlot> slot;
  uint8_t* base = nullptr;
  if (fork) {
    fd = ::open(resp.slot_path().c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      return Abandon(step, io::ErrnoToStatus(errno, resp.slot_path()));
    }
  } else {
    absl::StatusOr<std::shared_ptr<MappedSlot>> mapped =
        MapSlot(resp.slot_path(), resp.slot_bytes());
    if (!mapped.ok()) return Abandon(step, mapped.status());
    slot = *std::move(mapped);
    base = slot->file->data();
  }
  // Byte items are captured now: the caller may change them as soon as
  // SaveAsync returns.
  std::vector<HostRegion> byte_items;
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].bytes == nullptr) continue;
    if (fork) {
      byte_items.push_back({items_[i].bytes->data(), items_[i].bytes->size(),
                            layout[i].slot_offset()});
    } else {
      std::memcpy(base + layout[i].slot_offset(), items_[i].bytes->data(),
                  items_[i].bytes->size());
    }
  }
  if (fork) {
    if (const int err = WriteRegions(fd, byte_items); err != 0) {
      ::close(fd);
      return Abandon(step, io::ErrnoToStatus(err, resp.slot_path()));
    }
  }
  auto copy_tensors = [this,
                       base](const std::vector<proto::StagedItem>& layout) {
    if (device_->host_resident() && !device_->queues_copies()) {
      // Host tensors: plain memory copies, spread over several threads.
      std::vector<CopyRegion> copies;
      size_t total = 0;
      for (size_t i = 0; i < items_.size(); ++i) {
        if (!items_[i].is_tensor() || items_[i].item.raw_size() == 0) continue;
        copies.push_back({items_[i].tensor, base + layout[i].slot_offset(),
                          items_[i].item.raw_size()});
        total += items_[i].item.raw_size();
      }
      ParallelHostCopy(copies, CopyThreadsFor(total));
      for (size_t i = 0; i < copies.size(); ++i) {
        CKPT_KILL_POINT("client.item_copied");
      }
      return absl::OkStatus();
    }
    for (size_t i = 0; i < items_.size(); ++i) {
      if (!items_[i].is_tensor() || items_[i].item.raw_size() == 0) continue;
      RETURN_IF_ERROR(device_->CopyToHost(items_[i].tensor,
                                          base + layout[i].slot_offset(),
                                          items_[i].item.raw_size()));
      CKPT_KILL_POINT("client.item_copied");
    }
    return absl::OkStatus();
  };
  // A device with streams gets its copies queued here, before SaveAsync
  // returns, so that the trainer's next kernels can be ordered after them; the
  // copier thread only waits. The CPU device copies on the copier thread.
  std::shared_ptr<kernels::Event> copied;
  if (device_->queues_copies()) {
    absl::Status queued = device_->WaitForStream(options_.compute_stream);
    if (queued.ok()) queued = copy_tensors(layout);
    absl::StatusOr<std::unique_ptr<kernels::Event>> event =
        queued.ok() ? device_->RecordEvent()
                    : absl::StatusOr<std::unique_ptr<kernels::Event>>(queued);
    if (event.ok() && options_.order_compute_stream) {
      queued = device_->StreamWaitEvent(options_.compute_stream, **event);
    }
    if (!event.ok()) queued = event.status();
    if (!queued.ok()) {
      // Copies already queued may still be writing into the slot: let them
      // finish before the daemon gets it back.
      (void)device_->Synchronize();
      return Abandon(step, queued);
    }
    copied = *std::move(event);
  }
  auto handle = std::shared_ptr<SaveHandle>(
      new SaveHandle(rpc_, failures_, options_.job, step));
  copier_ =
      std::thread([this, handle, step, layout = std::move(layout), slot, copied,
                   copy_tensors, fork, fd, regions = std::move(regions),
                   slot_path = resp.slot_path()]() mutable {
        absl::Status status;
        bool forked = false;
        if (fork) {
          // The fork runs here: the child dies with the thread that forked it,
          // and this one lives until the child is done.
          absl::StatusOr<std::unique_ptr<ForkedCopy>> child =
              ForkedCopy::Start(fd, regions);
          if (child.ok()) {
            forked = true;
            handle->Copied(absl::OkStatus());  // captured: training may go on
            CKPT_KILL_POINT("client.forked");
            status = (*child)->Wait();
            if (status.ok()) CKPT_KILL_POINT("client.item_copied");
          } else {
            // No fork (out of memory, say): the same bytes, written here.
            CKPT_LOG_WARN("saving step {}: writing instead of forking: {}",
                          step, child.status().ToString());
            const int err = WriteRegions(fd, regions);
            status =
                err == 0 ? absl::OkStatus() : io::ErrnoToStatus(err, slot_path);
            handle->Copied(status);
          }
          ::close(fd);
        } else {
          status = copied != nullptr ? copied->Wait() : copy_tensors(layout);
          handle->Copied(status);
        }
        {
          absl::MutexLock lock(&mu_);
          if (copied == nullptr && !regions.empty()) {
            ++(forked ? stats_.saves_forked : stats_.saves_copied);
          }
        }
        // The hand-over runs on its own thread, in save order, so the next
        // SaveAsync waits only for this copy, not for the daemon's bookkeeping.
        handover_->Schedule(
            [this, handle, step, layout = std::move(layout), status]() mutable {
              HandOver(handle, step, layout, std::move(status));
            });
      });
  return handle;
}

void Checkpointer::HandOver(const std::shared_ptr<SaveHandle>& handle,
                            uint64_t step,
                            const std::vector<proto::StagedItem>& layout,
                            absl::Status status) {
  proto::ShardKey key;
  key.set_job(options_.job);
  key.set_step(step);
  key.set_rank(options_.rank);
  CKPT_KILL_POINT("client.before_stage_complete");
  if (status.ok()) {
    proto::StageCompleteRequest done;
    *done.mutable_shard() = key;
    for (const auto& staged : layout) *done.add_items() = staged;
    proto::StageCompleteResponse ok;
    status = rpc_->Call(&proto::CkptDaemon::Stub::StageComplete, done, &ok,
                        absl::StrCat("staging step ", step));
  } else {
    proto::AbortStageRequest abort;
    *abort.mutable_shard() = key;
    proto::AbortStageResponse ignored;
    (void)rpc_->Call(&proto::CkptDaemon::Stub::AbortStage, abort, &ignored,
                     "abort");
  }
  CKPT_KILL_POINT("client.after_stage_complete");
  if (!status.ok()) failures_->Record(status);
  handle->Finish(status);
}

absl::Status Checkpointer::Abandon(uint64_t step, absl::Status status) {
  status = absl::Status(status.code(), absl::StrCat("saving step ", step, ": ",
                                                    status.message()));
  // In save order with the hand-overs before it; the abort gives the slot back.
  auto handle = std::shared_ptr<SaveHandle>(
      new SaveHandle(rpc_, failures_, options_.job, step));
  handover_->Schedule(
      [this, handle, step, status] { HandOver(handle, step, {}, status); });
  return status;
}

absl::StatusOr<std::shared_ptr<Checkpointer::MappedSlot>> Checkpointer::MapSlot(
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
                     device_->RegisterHost(slot->file->data(), bytes));
    found = std::move(slot);
    absl::MutexLock lock(&mu_);
    ++stats_.slots_mapped;
  }
  mapped_.insert(mapped_.begin(), found);
  if (mapped_.size() > static_cast<size_t>(options_.mapped_slots)) {
    mapped_.resize(options_.mapped_slots);
  }
  return found;
}

CheckpointerStats Checkpointer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<absl::optional<uint64_t>> Checkpointer::LatestCommitted(
    proto::Tier tier) {
  proto::LatestCommittedRequest req;
  req.set_job(options_.job);
  req.set_tier(tier);
  proto::LatestCommittedResponse resp;
  RETURN_IF_ERROR(rpc_->Call(&proto::CkptDaemon::Stub::LatestCommitted, req,
                             &resp, "latest committed step"));
  if (!resp.found()) return absl::optional<uint64_t>();
  return absl::optional<uint64_t>(resp.step());
}

absl::StatusOr<std::vector<uint64_t>> Checkpointer::ListCommitted(
    proto::Tier tier) {
  proto::ListCommitsRequest req;
  req.set_job(options_.job);
  proto::ListCommitsResponse resp;
  RETURN_IF_ERROR(rpc_->Call(&proto::CkptDaemon::Stub::ListCommits, req, &resp,
                             "listing committed steps"));
  std::vector<uint64_t> steps;
  for (const proto::CommitRecord& c : resp.commits()) {
    if (c.tier() == tier) steps.push_back(c.step());
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<proto::ShardRecord> Checkpointer::DescribeShard(uint64_t step) {
  proto::GetShardRequest req;
  req.mutable_shard()->set_job(options_.job);
  req.mutable_shard()->set_step(step);
  req.mutable_shard()->set_rank(options_.rank);
  proto::GetShardResponse resp;
  RETURN_IF_ERROR(rpc_->Call(&proto::CkptDaemon::Stub::GetShard, req, &resp,
                             absl::StrCat("shard of step ", step)));
  return resp.shard();
}

void Checkpointer::DrainHandovers() {
  if (copier_.joinable()) copier_.join();
  absl::Notification drained;
  handover_->Schedule([&drained] { drained.Notify(); });
  drained.WaitForNotification();
}

absl::Status Checkpointer::Restore(uint64_t step) {
  report_ = RestoreReport();
  absl::Status restored = RestoreFrom(step);
  if (restored.ok()) {
    // The figures are for the metrics; for a trainer (not read_only) the
    // report also withdraws its shards of newer uncommitted steps, which must
    // succeed before it saves again.
    proto::ReportRestoreRequest req;
    req.mutable_shard()->set_job(options_.job);
    req.mutable_shard()->set_step(step);
    req.mutable_shard()->set_rank(options_.rank);
    req.set_memory_bytes(report_.memory_bytes);
    req.set_local_disk_bytes(report_.disk_bytes);
    req.set_peer_bytes(report_.peer_bytes);
    req.set_checksum_mismatches(report_.mismatches);
    req.set_fallbacks(report_.fallbacks);
    req.set_resume(!options_.read_only);
    proto::ReportRestoreResponse ignored;
    absl::Status reported =
        rpc_->Call(&proto::CkptDaemon::Stub::ReportRestore, req, &ignored,
                   absl::StrCat("resuming from step ", step));
    if (req.resume()) return reported;
  }
  return restored;
}

absl::StatusOr<absl::optional<uint64_t>> Checkpointer::RestoreLatest(
    proto::Tier tier) {
  constexpr int kAttempts = 5;
  absl::Status failed;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    ASSIGN_OR_RETURN(absl::optional<uint64_t> latest, LatestCommitted(tier));
    if (!latest.has_value()) return latest;
    failed = Restore(*latest);
    if (failed.ok()) return latest;
    ASSIGN_OR_RETURN(absl::optional<uint64_t> now, LatestCommitted(tier));
    if (!now.has_value() || *now == *latest) return failed;
  }
  return failed;
}

// A shard whose bytes are whole somewhere: staged (its slot), persisted (its
// file, and maybe its slot), or failed to persist with its slot still there
// (a disk error does not touch the memory tier).
namespace {
bool Restorable(const proto::ShardRecord& shard) {
  return shard.state() == proto::SHARD_STAGED ||
         shard.state() == proto::SHARD_PERSISTED ||
         (shard.state() == proto::SHARD_FAILED && !shard.slot_path().empty());
}
}  // namespace

absl::Status Checkpointer::RestoreFrom(uint64_t step) {
  DrainHandovers();
  const std::string what = absl::StrCat(
      "restoring job ", options_.job, " step ", step, " rank ", options_.rank);
  // Only a committed step is restored: a step some rank never saved would mix
  // states of different steps.
  proto::ListCommitsRequest list;
  list.set_job(options_.job);
  proto::ListCommitsResponse commits;
  RETURN_IF_ERROR(
      rpc_->Call(&proto::CkptDaemon::Stub::ListCommits, list, &commits, what));
  auto commit = std::find_if(
      commits.commits().begin(), commits.commits().end(),
      [step](const proto::CommitRecord& c) { return c.step() == step; });
  if (commit == commits.commits().end()) {
    return absl::NotFoundError(
        absl::StrCat(what, ": step ", step, " is not committed at any tier"));
  }
  if (commit->world_size() != options_.world_size) {
    return RestoreResharded(step, commit->world_size(), what);
  }
  if (device_->host_resident()) {
    // A shard on no local tier streams straight from a peer into place.
    absl::Status streamed = RestoreFromPeerStream(step, what);
    if (streamed.ok()) return streamed;
    if (!absl::IsFailedPrecondition(streamed) && !absl::IsNotFound(streamed)) {
      CKPT_LOG_WARN("{}: streaming from a peer failed ({}); ckptd fetches it",
                    what, streamed.ToString());
      if (absl::IsDataLoss(streamed)) ++report_.mismatches;
      ++report_.fallbacks;
    }
  }
  ASSIGN_OR_RETURN(const proto::ShardRecord shard, DescribeShard(step));
  if (!Restorable(shard)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the shard is not staged (state ",
                     proto::ShardState_Name(shard.state()), ")"));
  }
  // Every registered item must be in the shard with the same description.
  std::vector<const proto::StagedItem*> sources;
  for (const Registered& r : items_) {
    const proto::StagedItem* found = nullptr;
    for (const proto::StagedItem& s : shard.items()) {
      if (s.item().name() == r.item.name()) found = &s;
    }
    if (found == nullptr) {
      return absl::NotFoundError(
          absl::StrCat(what, ": \"", r.item.name(), "\" was not saved"));
    }
    if (r.is_tensor() && found->item().dtype() == r.item.dtype() &&
        std::equal(found->item().global_shape().begin(),
                   found->item().global_shape().end(),
                   r.item.global_shape().begin(),
                   r.item.global_shape().end()) &&
        (!std::equal(found->item().box_offset().begin(),
                     found->item().box_offset().end(),
                     r.item.box_offset().begin(), r.item.box_offset().end()) ||
         !std::equal(found->item().box_length().begin(),
                     found->item().box_length().end(),
                     r.item.box_length().begin(), r.item.box_length().end()))) {
      // Same world, other boxes: the tensors are resharded.
      return RestoreResharded(step, commit->world_size(), what);
    }
    if (r.is_tensor() &&
        (found->item().dtype() != r.item.dtype() ||
         !std::equal(found->item().global_shape().begin(),
                     found->item().global_shape().end(),
                     r.item.global_shape().begin(),
                     r.item.global_shape().end()) ||
         !std::equal(found->item().box_offset().begin(),
                     found->item().box_offset().end(),
                     r.item.box_offset().begin(), r.item.box_offset().end()) ||
         !std::equal(found->item().box_length().begin(),
                     found->item().box_length().end(),
                     r.item.box_length().begin(), r.item.box_length().end()))) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": tensor \"", r.item.name(), "\" was saved as ",
                       snapshot::DTypeName(found->item().dtype()),
                       " with another shape or box"));
    }
    sources.push_back(found);
  }
  // The persisted manifest, when there is one, carries the checksum of every
  // raw chunk: the memory-tier copy is checked against it before it is used.
  std::unique_ptr<snapshot::ShardReader> reader;
  absl::Status reader_status = absl::NotFoundError("no shard file");
  if (!shard.shard_path().empty()) {
    absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> opened =
        snapshot::ShardReader::Open(io::DefaultFileSystem(),
                                    shard.shard_path());
    reader_status = opened.status();
    if (opened.ok()) reader = *std::move(opened);
  }
  if (!shard.slot_path().empty()) {
    absl::StatusOr<std::unique_ptr<io::MappedFile>> slot =
        io::DefaultFileSystem()->MapFile(shard.slot_path(),
                                         {.writable = false});
    absl::Status usable = slot.status();
    if (usable.ok() && (*slot)->size() < shard.slot_bytes()) {
      usable = absl::DataLossError(absl::StrCat(
          "staging slot ", shard.slot_path(), " has ", (*slot)->size(),
          " bytes, expected ", shard.slot_bytes()));
    }
    const bool host = device_->host_resident() && !device_->queues_copies();
    if (usable.ok() && host) {
      // Host memory: each chunk is copied and then checked where it landed,
      // while it is still in the cache, on several threads. What the trainer
      // got is what is verified (the slot is the daemon's, and a retention
      // may hand it to another save meanwhile).
      usable = CopyAndVerify((*slot)->data(), sources, reader.get());
      if (usable.ok()) {
        for (const proto::StagedItem* s : sources)
          report_.memory_bytes += s->item().raw_size();
        return absl::OkStatus();
      }
    } else if (usable.ok()) {
      uint64_t copied = 0;
      for (size_t i = 0; i < items_.size() && usable.ok(); ++i) {
        const uint8_t* src = (*slot)->data() + sources[i]->slot_offset();
        uint64_t n = sources[i]->item().raw_size();
        copied += n;
        if (items_[i].is_tensor()) {
          usable = device_->CopyFromHost(src, items_[i].tensor, n);
        } else {
          items_[i].bytes->assign(reinterpret_cast<const char*>(src), n);
        }
      }
      if (usable.ok()) usable = device_->Synchronize();
      // Checked after the copy, not before: the slot is the daemon's, and one
      // retention released meanwhile may already hold another save's bytes.
      // What was copied is good only if the slot still verifies now.
      if (usable.ok() && reader != nullptr) {
        usable = VerifySlot((*slot)->data(), sources, *reader);
      }
      if (usable.ok()) {
        report_.memory_bytes += copied;
        return absl::OkStatus();
      }
    }
    if (reader == nullptr) {
      return absl::Status(
          usable.code(),
          absl::StrCat(what, ": memory tier: ", usable.message()));
    }
    CKPT_LOG_WARN("{}: memory tier unusable ({}); reading the shard file", what,
                  usable.ToString());
    if (usable.code() == absl::StatusCode::kDataLoss) ++report_.mismatches;
    ++report_.fallbacks;
  }
  auto read_file = [&]() -> absl::Status {
    if (reader == nullptr) {
      if (shard.shard_path().empty()) {
        return absl::NotFoundError(
            absl::StrCat(what, ": neither a slot nor a shard file is left"));
      }
      return reader_status;
    }
    // Tensors in device memory are read into host memory first.
    std::vector<uint8_t> host;
    for (Registered& r : items_) {
      ASSIGN_OR_RETURN(const proto::Item* item,
                       reader->FindItem(r.item.name()));
      report_.disk_bytes += item->raw_size();
      if (r.is_tensor() && device_->host_resident()) {
        RETURN_IF_ERROR(reader->ReadItem(
            r.item.name(), absl::Span<uint8_t>(static_cast<uint8_t*>(r.tensor),
                                               r.item.raw_size())));
      } else if (r.is_tensor()) {
        host.resize(r.item.raw_size());
        RETURN_IF_ERROR(reader->ReadItem(r.item.name(), absl::MakeSpan(host)));
        RETURN_IF_ERROR(
            device_->CopyFromHost(host.data(), r.tensor, host.size()));
        RETURN_IF_ERROR(device_->Synchronize());
      } else {
        std::string value(item->raw_size(), '\0');
        RETURN_IF_ERROR(reader->ReadItem(
            r.item.name(),
            absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(value.data()),
                                value.size())));
        *r.bytes = std::move(value);
      }
    }
    return absl::OkStatus();
  };
  absl::Status from_file = read_file();
  if (from_file.ok() || options_.world_size == 1 ||
      (from_file.code() != absl::StatusCode::kDataLoss &&
       from_file.code() != absl::StatusCode::kNotFound)) {
    return from_file;
  }
  // This rank's copy is lost; other ranks may have saved the same boxes
  // (replicated, data-parallel state).
  absl::Status from_replicas =
      RestoreResharded(step, commit->world_size(), what);
  if (from_replicas.ok()) {
    CKPT_LOG_WARN("{} (restored from other ranks' replicas)",
                  from_file.ToString());
    ++report_.fallbacks;
    return from_replicas;
  }
  return absl::Status(
      from_file.code(),
      absl::StrCat(from_file.message(), "; no other rank saved a replica: ",
                   from_replicas.message()));
}

namespace {
// Whether a saved item has the registered one's kind, dtype, shape and box.
bool SameLayout(const proto::Item& saved, const proto::Item& registered) {
  auto same = [](const auto& a, const auto& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  };
  return saved.kind() == registered.kind() &&
         saved.dtype() == registered.dtype() &&
         same(saved.global_shape(), registered.global_shape()) &&
         same(saved.box_offset(), registered.box_offset()) &&
         same(saved.box_length(), registered.box_length());
}
}  // namespace

absl::Status Checkpointer::RestoreFromPeerStream(uint64_t step,
                                                 const std::string& what) {
  proto::GetShardRequest req;
  req.mutable_shard()->set_job(options_.job);
  req.mutable_shard()->set_step(step);
  req.mutable_shard()->set_rank(options_.rank);
  proto::PeerShardOffer offer;
  RETURN_IF_ERROR(
      rpc_->Call(&proto::CkptDaemon::Stub::OfferPeerShard, req, &offer, what));
  const std::string from =
      absl::StrCat(what, ": from node ", offer.node(), "'s ",
                   offer.tier() == proto::TIER_PEER ? "memory" : "disk");
  absl::StatusOr<proto::ShardManifest> manifest =
      snapshot::ParseStreamManifest(offer.manifest(), offer.file_bytes());
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat(from, ": ", manifest.status().message()));
  }
  // The registered items land in place; the others are read (and checked)
  // into scratch memory.
  std::vector<absl::Span<uint8_t>> dst(manifest->items_size());
  std::vector<std::string> values(items_.size());
  uint64_t bytes = 0;
  for (size_t k = 0; k < items_.size(); ++k) {
    Registered& r = items_[k];
    int m = 0;
    while (m < manifest->items_size() &&
           manifest->items(m).name() != r.item.name()) {
      ++m;
    }
    if (m == manifest->items_size() ||
        (r.is_tensor() && !SameLayout(manifest->items(m), r.item))) {
      // Not saved, or saved with other boxes: GetShard's path says so, or
      // reshards.
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": \"", r.item.name(), "\" was not saved alike"));
    }
    const uint64_t n = manifest->items(m).raw_size();
    if (r.is_tensor()) {
      dst[m] = absl::Span<uint8_t>(static_cast<uint8_t*>(r.tensor), n);
    } else {
      values[k].resize(n);
      dst[m] =
          absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(values[k].data()), n);
    }
    bytes += n;
  }
  std::vector<std::vector<uint8_t>> scratch;
  for (int m = 0; m < manifest->items_size(); ++m) {
    if (dst[m].data() != nullptr || manifest->items(m).raw_size() == 0)
      continue;
    scratch.emplace_back(manifest->items(m).raw_size());
    dst[m] = absl::MakeSpan(scratch.back());
  }
  absl::StatusOr<std::unique_ptr<daemon::BulkStream>> stream =
      daemon::BulkStream::Open(offer.host(), static_cast<int>(offer.port()),
                               offer.ticket(), absl::Seconds(30));
  absl::Status s = stream.status();
  if (s.ok() && (*stream)->size() != offer.file_bytes()) {
    s = absl::DataLossError(absl::StrCat("the file has ", (*stream)->size(),
                                         " bytes, the offer said ",
                                         offer.file_bytes()));
  }
  if (s.ok()) {
    // Compressed chunks decode on every core while the next ones arrive.
    io::ThreadPool decoders(
        static_cast<int>(std::max(2u, std::thread::hardware_concurrency())));
    s = snapshot::ReadShardStream(
        [&](absl::Span<uint8_t> out) { return (*stream)->Read(out); },
        offer.file_bytes(), *manifest, offer.manifest(), dst, &decoders);
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(from, ": ", s.message()));
  }
  for (size_t k = 0; k < items_.size(); ++k) {
    if (!items_[k].is_tensor()) *items_[k].bytes = std::move(values[k]);
  }
  report_.peer_bytes += bytes;
  return absl::OkStatus();
}

// One saved rank's shard of the step being restored onto another layout: its
// description always, its bytes (a verified slot, else the file) once a
// registered item overlaps it.
struct Checkpointer::SavedRank {
  proto::ShardRecord shard;
  bool opened = false;
  absl::Status open_status;  // of the first OpenSavedRank
  std::unique_ptr<snapshot::ShardReader> reader;
  std::unique_ptr<io::MappedFile> slot;  // usable: verified, or not persisted

  const proto::StagedItem* Find(const std::string& name) const {
    for (const proto::StagedItem& s : shard.items()) {
      if (s.item().name() == name) return &s;
    }
    return nullptr;
  }
};

absl::Status Checkpointer::OpenSavedRank(SavedRank& saved,
                                         const std::string& what) {
  if (!saved.opened) {
    saved.opened = true;
    saved.open_status = OpenSavedRankOnce(saved, what);
  }
  return saved.open_status;
}

absl::Status Checkpointer::OpenSavedRankOnce(SavedRank& saved,
                                             const std::string& what) {
  const proto::ShardRecord& shard = saved.shard;
  absl::Status reader_status = absl::NotFoundError("no shard file");
  if (!shard.shard_path().empty()) {
    auto opened = snapshot::ShardReader::Open(io::DefaultFileSystem(),
                                              shard.shard_path());
    reader_status = opened.status();
    if (opened.ok()) saved.reader = *std::move(opened);
  }
  if (!shard.slot_path().empty()) {
    auto slot = io::DefaultFileSystem()->MapFile(shard.slot_path(),
                                                 {.writable = false});
    absl::Status usable = slot.status();
    if (usable.ok() && (*slot)->size() < shard.slot_bytes()) {
      usable = absl::DataLossError(
          absl::StrCat("staging slot ", shard.slot_path(), " is short"));
    }
    if (usable.ok() && saved.reader != nullptr) {
      std::vector<const proto::StagedItem*> all;
      for (const proto::StagedItem& s : shard.items()) all.push_back(&s);
      usable = VerifySlot((*slot)->data(), all, *saved.reader);
    }
    if (usable.ok()) {
      saved.slot = *std::move(slot);
      return absl::OkStatus();
    }
    if (saved.reader == nullptr) {
      return absl::Status(usable.code(),
                          absl::StrCat(what, ": saved rank ", shard.rank(),
                                       ": memory tier: ", usable.message()));
    }
    CKPT_LOG_WARN("{}: saved rank {}: memory tier unusable ({}); reading {}",
                  what, shard.rank(), usable.ToString(), shard.shard_path());
    if (usable.code() == absl::StatusCode::kDataLoss) ++report_.mismatches;
    ++report_.fallbacks;
  }
  if (saved.reader == nullptr) {
    return absl::Status(
        reader_status.code(),
        absl::StrCat(what, ": saved rank ", shard.rank(), ": ",
                     shard.shard_path().empty()
                         ? "neither a slot nor a shard file is left"
                         : reader_status.message()));
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::RestoreResharded(uint64_t step, uint32_t saved_world,
                                            const std::string& what) {
  std::vector<SavedRank> saved(saved_world);
  for (uint32_t o = 0; o < saved_world; ++o) {
    proto::GetShardRequest req;
    req.mutable_shard()->set_job(options_.job);
    req.mutable_shard()->set_step(step);
    req.mutable_shard()->set_rank(o);
    proto::GetShardResponse resp;
    RETURN_IF_ERROR(rpc_->Call(&proto::CkptDaemon::Stub::GetShard, req, &resp,
                               absl::StrCat(what, ": saved rank ", o)));
    if (!Restorable(resp.shard())) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": saved rank ", o, "'s shard is ",
                       proto::ShardState_Name(resp.shard().state())));
    }
    saved[o].shard = resp.shard();
  }
  std::vector<uint8_t> host, part;
  for (Registered& r : items_) {
    if (!r.is_tensor()) {
      // Byte items are per rank (RNG states, loader positions): a rank takes
      // the one of the saved rank with its number, else saved rank 0's; when
      // that copy is lost, another rank's (replicated state).
      std::vector<uint32_t> order;
      if (options_.rank < saved_world) order.push_back(options_.rank);
      for (uint32_t o = 0; o < saved_world; ++o) {
        if (o != options_.rank) order.push_back(o);
      }
      absl::Status read;
      for (size_t k = 0; k < order.size(); ++k) {
        SavedRank& src = saved[order[k]];
        const proto::StagedItem* staged = src.Find(r.item.name());
        if (staged == nullptr) {
          read = absl::NotFoundError(absl::StrCat(what, ": \"", r.item.name(),
                                                  "\" was not saved by rank ",
                                                  src.shard.rank()));
        } else {
          read = OpenSavedRank(src, what);
        }
        std::string value;
        if (read.ok()) {
          value.assign(staged->item().raw_size(), '\0');
          if (src.slot != nullptr) {
            std::memcpy(value.data(), src.slot->data() + staged->slot_offset(),
                        value.size());
          } else {
            read = src.reader->ReadItem(
                r.item.name(),
                absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(value.data()),
                                    value.size()));
          }
        }
        if (read.ok()) {
          (src.slot != nullptr ? report_.memory_bytes : report_.disk_bytes) +=
              value.size();
          *r.bytes = std::move(value);
          break;
        }
        if (read.code() != absl::StatusCode::kDataLoss) return read;
        if (k + 1 < order.size()) ++report_.fallbacks;
      }
      RETURN_IF_ERROR(read);
      continue;
    }
    const size_t width = snapshot::DTypeSize(r.item.dtype());
    const snapshot::Box want{
        {r.item.box_offset().begin(), r.item.box_offset().end()},
        {r.item.box_length().begin(), r.item.box_length().end()}};
    absl::Span<uint8_t> dst;
    if (device_->host_resident()) {
      dst = absl::Span<uint8_t>(static_cast<uint8_t*>(r.tensor),
                                r.item.raw_size());
    } else {
      host.resize(r.item.raw_size());
      dst = absl::MakeSpan(host);
    }
    // The saved boxes overlapping this rank's box, grouped by box: the ranks
    // of one group are replicas (data-parallel state saved by every rank).
    // One replica of each group is read, the next one if it fails.
    struct Source {
      SavedRank* rank;
      const proto::StagedItem* staged;
    };
    std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>,
             std::vector<Source>>
        groups;
    for (SavedRank& src : saved) {
      const proto::StagedItem* staged = src.Find(r.item.name());
      if (staged == nullptr) continue;
      const proto::Item& had = staged->item();
      if (had.dtype() != r.item.dtype() ||
          !std::equal(had.global_shape().begin(), had.global_shape().end(),
                      r.item.global_shape().begin(),
                      r.item.global_shape().end())) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": tensor \"", r.item.name(), "\" was saved by rank ",
            src.shard.rank(), " as ", snapshot::DTypeName(had.dtype()),
            " with another global shape"));
      }
      snapshot::Box box{{had.box_offset().begin(), had.box_offset().end()},
                        {had.box_length().begin(), had.box_length().end()}};
      if (snapshot::Intersect(box, want).elements() == 0) continue;
      groups[{std::move(box.offset), std::move(box.length)}].push_back(
          {&src, staged});
    }
    // Copies the overlap of one saved box; returns the elements copied.
    auto copy_from = [&](const Source& source) -> absl::StatusOr<int64_t> {
      SavedRank& src = *source.rank;
      const proto::Item& had = source.staged->item();
      const snapshot::Box box{
          {had.box_offset().begin(), had.box_offset().end()},
          {had.box_length().begin(), had.box_length().end()}};
      const snapshot::Box common = snapshot::Intersect(box, want);
      RETURN_IF_ERROR(OpenSavedRank(src, what));
      const uint8_t* bytes;
      if (src.slot != nullptr) {
        bytes = src.slot->data() + source.staged->slot_offset();
      } else {
        // Only the byte range spanning the overlap is read (and only the
        // chunks under it decoded).
        auto flat = [&](bool last) {
          int64_t i = 0;
          for (size_t d = 0; d < box.offset.size(); ++d) {
            int64_t at = common.offset[d] + (last ? common.length[d] - 1 : 0);
            i = i * box.length[d] + (at - box.offset[d]);
          }
          return static_cast<uint64_t>(i);
        };
        const uint64_t lo = flat(false) * width, hi = (flat(true) + 1) * width;
        part.resize(had.raw_size());
        RETURN_IF_ERROR(src.reader->ReadItemRange(
            r.item.name(), lo, absl::MakeSpan(part.data() + lo, hi - lo)));
        bytes = part.data();
      }
      (src.slot != nullptr ? report_.memory_bytes : report_.disk_bytes) +=
          common.elements() * width;
      return snapshot::CopyBoxIntersection(
          absl::MakeConstSpan(bytes, had.raw_size()), box, dst, want, width);
    };
    int64_t covered = 0;
    for (auto& [box, replicas] : groups) {
      // Spread the reads of replicated state over the saved ranks: this rank
      // starts with the replica of its own number when there is one.
      std::stable_sort(replicas.begin(), replicas.end(),
                       [&](const Source& a, const Source& b) {
                         return (a.rank->shard.rank() == options_.rank) >
                                (b.rank->shard.rank() == options_.rank);
                       });
      if (replicas.front().rank->shard.rank() != options_.rank) {
        std::rotate(replicas.begin(),
                    replicas.begin() + options_.rank % replicas.size(),
                    replicas.end());
      }
      absl::StatusOr<int64_t> copied;
      for (size_t i = 0; i < replicas.size(); ++i) {
        copied = copy_from(replicas[i]);
        if (copied.ok()) break;
        if (i + 1 < replicas.size()) report_.fallbacks++;  // another replica
      }
      if (!copied.ok()) return copied.status();
      covered += *copied;
    }
    if (covered != want.elements()) {
      return absl::NotFoundError(absl::StrCat(
          what, ": tensor \"", r.item.name(), "\": the shards saved by ",
          saved_world, " rank(s) cover ", covered, " of the ", want.elements(),
          " elements of this rank's box",
          covered > want.elements() ? " (saved boxes overlap)" : ""));
    }
    if (!device_->host_resident()) {
      RETURN_IF_ERROR(
          device_->CopyFromHost(host.data(), r.tensor, host.size()));
      RETURN_IF_ERROR(device_->Synchronize());
    }
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::CopyAndVerify(
    const uint8_t* slot, const std::vector<const proto::StagedItem*>& sources,
    const snapshot::ShardReader* reader) {
  struct Unit {
    const uint8_t* src;
    uint8_t* dst;
    uint64_t bytes;
    const proto::Item* item;  // null: not persisted yet, nothing to check
    int chunk;
  };
  std::vector<Unit> units;
  uint64_t total = 0;
  for (size_t i = 0; i < items_.size(); ++i) {
    const uint8_t* src = slot + sources[i]->slot_offset();
    const uint64_t n = sources[i]->item().raw_size();
    const proto::Item* item = nullptr;
    if (reader != nullptr) {
      ASSIGN_OR_RETURN(item, reader->FindItem(sources[i]->item().name()));
      if (item->raw_size() != n) {
        return absl::DataLossError(absl::StrCat(
            "item \"", item->name(), "\" has ", n, " bytes in the slot but ",
            item->raw_size(), " in ", reader->path()));
      }
    }
    if (!items_[i].is_tensor()) {
      items_[i].bytes->assign(reinterpret_cast<const char*>(src), n);
      if (item != nullptr) {
        std::vector<absl::Status> bad = snapshot::VerifyRawItem(
            absl::MakeConstSpan(
                reinterpret_cast<const uint8_t*>(items_[i].bytes->data()), n),
            *item, /*max_errors=*/1);
        if (!bad.empty()) return bad.front();
      }
      continue;
    }
    auto* dst = static_cast<uint8_t*>(items_[i].tensor);
    total += n;
    if (item == nullptr) {
      for (uint64_t off = 0; off < n; off += uint64_t{4} << 20) {
        units.push_back({src + off, dst + off,
                         std::min<uint64_t>(uint64_t{4} << 20, n - off),
                         nullptr, 0});
      }
      continue;
    }
    for (int c = 0; c < item->chunks_size(); ++c) {
      const proto::ChunkInfo& chunk = item->chunks(c);
      if (chunk.raw_offset() > n || chunk.raw_size() > n - chunk.raw_offset()) {
        return absl::DataLossError(absl::StrCat(
            "chunk ", c, " of item \"", item->name(), "\" lies outside it"));
      }
      units.push_back({src + chunk.raw_offset(), dst + chunk.raw_offset(),
                       chunk.raw_size(), item, c});
    }
  }
  std::vector<absl::Status> results(units.size());
  ParallelFor(units.size(), CopyThreadsFor(total), [&](size_t u) {
    const Unit& unit = units[u];
    std::memcpy(unit.dst, unit.src, unit.bytes);
    if (unit.item == nullptr) return;
    if (snapshot::Checksum(absl::MakeConstSpan(unit.dst, unit.bytes)) !=
        unit.item->chunks(unit.chunk).raw_xxh3()) {
      results[u] = absl::DataLossError(absl::StrCat(
          "item \"", unit.item->name(), "\" chunk ", unit.chunk,
          ": the copy from the staging slot does not match the checksum in ",
          reader->path()));
    }
  });
  for (absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::VerifySlot(
    const uint8_t* slot, const std::vector<const proto::StagedItem*>& sources,
    const snapshot::ShardReader& reader) const {
  // Items are checked on several threads: hashing a large slot on one core
  // would be most of a restore from memory.
  std::vector<absl::Status> results(sources.size());
  uint64_t total = 0;
  for (const proto::StagedItem* staged : sources)
    total += staged->item().raw_size();
  ParallelFor(sources.size(), CopyThreadsFor(total), [&](size_t i) {
    const proto::StagedItem* staged = sources[i];
    absl::StatusOr<const proto::Item*> item =
        reader.FindItem(staged->item().name());
    if (!item.ok()) {
      results[i] = item.status();
      return;
    }
    if ((*item)->raw_size() != staged->item().raw_size()) {
      results[i] = absl::DataLossError(absl::StrCat(
          "item \"", (*item)->name(), "\" has ", staged->item().raw_size(),
          " bytes in the slot but ", (*item)->raw_size(), " in ",
          reader.path()));
      return;
    }
    std::vector<absl::Status> bad = snapshot::VerifyRawItem(
        absl::MakeConstSpan(slot + staged->slot_offset(), (*item)->raw_size()),
        **item, /*max_errors=*/1);
    if (!bad.empty()) {
      results[i] = absl::DataLossError(
          absl::StrCat("the staging slot differs from ", reader.path(), ": ",
                       bad.front().message()));
    }
  });
  for (absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Checkpointer::WatchFailures(FailureCallback callback) {
  if (watcher_.joinable()) {
    return absl::AlreadyExistsError("failures are already being watched");
  }
  // The baseline first, so that a failure right after this call is seen.
  proto::WatchMembersRequest req;
  proto::WatchMembersResponse first;
  RETURN_IF_ERROR(rpc_->Call(&proto::CkptDaemon::Stub::WatchMembers, req,
                             &first, "watching the job's nodes"));
  watcher_ = std::thread(
      [this, callback = std::move(callback), first = std::move(first)] {
        std::set<std::string> alive(first.nodes().begin(), first.nodes().end());
        int64_t revision = first.revision();
        while (!stop_watching_) {
          proto::WatchMembersRequest req;
          req.set_after_revision(revision);
          req.set_timeout_ms(500);  // bounds how long a destructor waits
          proto::WatchMembersResponse now;
          absl::Status s =
              rpc_->Call(&proto::CkptDaemon::Stub::WatchMembers, req, &now,
                         "watching the job's nodes", absl::Milliseconds(500));
          if (!s.ok()) {  // the daemon is restarting: try again
            absl::SleepFor(absl::Milliseconds(200));
            continue;
          }
          revision = now.revision();
          std::set<std::string> current(now.nodes().begin(), now.nodes().end());
          std::vector<std::string> lost;
          for (const std::string& n : alive) {
            if (current.count(n) == 0) lost.push_back(n);
          }
          alive = std::move(current);
          if (lost.empty()) continue;
          {
            absl::MutexLock lock(&mu_);
            lost_.insert(lost_.end(), lost.begin(), lost.end());
          }
          if (callback) callback(lost);
        }
      });
  return absl::OkStatus();
}

std::vector<std::string> Checkpointer::LostNodes() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

}  // namespace ckpt::client
