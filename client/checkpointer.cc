#include "client/checkpointer.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "io/errno_status.h"
#include "io/file_system.h"
#include "io/status_macros.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/dtype.h"
#include "snapshot/format.h"
#include "snapshot/names.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {
namespace {

// The one place where a gRPC status becomes an absl::Status (the codes are the
// same numbers).
absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

constexpr uint64_t kItemAlignment =
    64;  // items start cache-line aligned in the slot

}  // namespace

std::string DefaultSocketPath() {
  return absl::StrCat("/tmp/ckpt-", ::geteuid(), "/ckptd.sock");
}

struct Checkpointer::Registered {
  proto::Item item;
  void* tensor = nullptr;        // tensors
  std::string* bytes = nullptr;  // byte items
};

// The gRPC stub and the deadline every call gets.
class Checkpointer::Rpc {
 public:
  Rpc(std::shared_ptr<grpc::Channel> channel, absl::Duration timeout)
      : stub_(proto::CkptDaemon::NewStub(std::move(channel))),
        timeout_(timeout) {}

  template <typename Request, typename Response, typename Method>
  absl::Status Call(Method method, const Request& request, Response* response,
                    absl::string_view what,
                    absl::Duration extra = absl::ZeroDuration()) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_ + extra));
    return FromGrpc((stub_.get()->*method)(&context, request, response), what);
  }

 private:
  std::unique_ptr<proto::CkptDaemon::Stub> stub_;
  const absl::Duration timeout_;
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
  req.set_job(owner_->options_.job);
  req.set_step(step_);
  req.set_tier(tier);
  req.set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
  proto::WaitCommittedResponse resp;
  absl::Status s = owner_->rpc_->Call(
      &proto::CkptDaemon::Stub::WaitCommitted, req, &resp,
      absl::StrCat("waiting for step ", step_, " to commit"), timeout);
  if (!s.ok()) owner_->RecordFailure(s);
  return s;
}

Checkpointer::Checkpointer(const CheckpointerOptions& options)
    : options_(options),
      device_(kernels::NewCpuDevice()),
      handover_(std::make_unique<io::ThreadPool>(1)) {}

Checkpointer::~Checkpointer() {
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
  std::unique_ptr<Checkpointer> ckpt(new Checkpointer(options));
  ckpt->rpc_ = std::make_unique<Rpc>(
      grpc::CreateCustomChannel(absl::StrCat("unix://", options.socket_path),
                                grpc::InsecureChannelCredentials(), args),
      options.rpc_timeout);
  // A first call proves the daemon accepted us (it drops connections of other
  // uids).
  proto::LatestCommittedRequest probe;
  probe.set_job(options.job);
  probe.set_tier(proto::TIER_LOCAL_DISK);
  proto::LatestCommittedResponse resp;
  RETURN_IF_ERROR(
      ckpt->rpc_->Call(&proto::CkptDaemon::Stub::LatestCommitted, probe, &resp,
                       absl::StrCat("ckptd at ", options.socket_path)));
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
  items_.push_back(std::move(r));
  return absl::OkStatus();
}

absl::Status Checkpointer::RegisterBytes(const std::string& name,
                                         std::string* value) {
  RETURN_IF_ERROR(CheckNewName(name));
  Registered r;
  r.item.set_name(name);
  r.item.set_kind(proto::ITEM_KIND_BYTES);
  r.bytes = value;
  items_.push_back(std::move(r));
  return absl::OkStatus();
}

void Checkpointer::RecordFailure(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  last_failure_ = status;
}

absl::Status Checkpointer::LastSaveError() {
  absl::MutexLock lock(&mu_);
  return std::exchange(last_failure_, absl::OkStatus());
}

absl::StatusOr<std::shared_ptr<SaveHandle>> Checkpointer::SaveAsync(
    uint64_t step) {
  if (copier_.joinable())
    copier_.join();  // one copy at a time: slots are filled in order
  // The slot layout: every item at a 64-byte aligned offset; byte items are
  // sized now.
  std::vector<proto::StagedItem> layout;
  uint64_t offset = 0;
  for (Registered& r : items_) {
    if (r.bytes != nullptr) r.item.set_raw_size(r.bytes->size());
    proto::StagedItem staged;
    *staged.mutable_item() = r.item;
    staged.set_slot_offset(offset);
    offset = (offset + r.item.raw_size() + kItemAlignment - 1) /
             kItemAlignment * kItemAlignment;
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
    RecordFailure(s);
    return s;
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<io::MappedFile> slot,
      io::DefaultFileSystem()->MapFile(resp.slot_path(), {.populate = true}));
  auto handle = std::shared_ptr<SaveHandle>(new SaveHandle(this, step));
  // Byte items are captured now: the caller may change them as soon as
  // SaveAsync returns.
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].bytes != nullptr) {
      std::memcpy(slot->data() + layout[i].slot_offset(),
                  items_[i].bytes->data(), items_[i].bytes->size());
    }
  }
  copier_ =
      std::thread([this, handle, step, layout = std::move(layout),
                   slot = std::shared_ptr<io::MappedFile>(std::move(slot))] {
        absl::Status status;
        for (size_t i = 0; i < items_.size() && status.ok(); ++i) {
          if (items_[i].tensor == nullptr) continue;
          status = device_->CopyToHost(items_[i].tensor,
                                       slot->data() + layout[i].slot_offset(),
                                       items_[i].item.raw_size());
        }
        if (status.ok()) status = device_->Synchronize();
        handle->Copied(status);
        // The hand-over runs on its own thread, in save order, so the next
        // SaveAsync waits only for this copy, not for the daemon's bookkeeping.
        handover_->Schedule([this, handle, step, layout, status]() mutable {
          proto::ShardKey key;
          key.set_job(options_.job);
          key.set_step(step);
          key.set_rank(options_.rank);
          if (status.ok()) {
            proto::StageCompleteRequest done;
            *done.mutable_shard() = key;
            for (const auto& staged : layout) *done.add_items() = staged;
            proto::StageCompleteResponse ok;
            status = rpc_->Call(&proto::CkptDaemon::Stub::StageComplete, done,
                                &ok, absl::StrCat("staging step ", step));
          } else {
            proto::AbortStageRequest abort;
            *abort.mutable_shard() = key;
            proto::AbortStageResponse ignored;
            (void)rpc_->Call(&proto::CkptDaemon::Stub::AbortStage, abort,
                             &ignored, "abort");
          }
          if (!status.ok()) RecordFailure(status);
          handle->Finish(status);
        });
      });
  return handle;
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
  DrainHandovers();
  ASSIGN_OR_RETURN(const proto::ShardRecord shard, DescribeShard(step));
  const std::string what = absl::StrCat(
      "restoring job ", options_.job, " step ", step, " rank ", options_.rank);
  if (shard.state() != proto::SHARD_STAGED &&
      shard.state() != proto::SHARD_PERSISTED) {
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
    if (r.tensor != nullptr &&
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
  if (!shard.slot_path().empty()) {
    // Memory tier: a copy out of the slot.
    auto slot = io::DefaultFileSystem()->MapFile(shard.slot_path(),
                                                 {.writable = false});
    if (slot.ok()) {
      for (size_t i = 0; i < items_.size(); ++i) {
        const uint8_t* src = (*slot)->data() + sources[i]->slot_offset();
        uint64_t n = sources[i]->item().raw_size();
        if (items_[i].tensor != nullptr) {
          RETURN_IF_ERROR(device_->CopyFromHost(src, items_[i].tensor, n));
        } else {
          items_[i].bytes->assign(reinterpret_cast<const char*>(src), n);
        }
      }
      return device_->Synchronize();
    }
  }
  if (shard.shard_path().empty()) {
    return absl::NotFoundError(
        absl::StrCat(what, ": neither a slot nor a shard file is left"));
  }
  ASSIGN_OR_RETURN(
      auto reader,
      snapshot::ShardReader::Open(io::DefaultFileSystem(), shard.shard_path()));
  for (Registered& r : items_) {
    ASSIGN_OR_RETURN(const proto::Item* item, reader->FindItem(r.item.name()));
    if (r.tensor != nullptr) {
      RETURN_IF_ERROR(reader->ReadItem(
          r.item.name(), absl::Span<uint8_t>(static_cast<uint8_t*>(r.tensor),
                                             r.item.raw_size())));
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
}

}  // namespace ckpt::client
