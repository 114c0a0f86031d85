#include "client/checkpointer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "client/checkpointer_internal.h"
#include "client/save_stager.h"
#include "io/errno_status.h"
#include "io/host.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/format.h"
#include "snapshot/names.h"

namespace ckpt::client {

std::string DefaultSocketPath() {
  const char* env = std::getenv("CKPT_SOCKET");
  if (env != nullptr && env[0] != '\0') return env;
  return absl::StrCat("/tmp/ckpt-", ::geteuid(), "/ckptd.sock");
}

Checkpointer::Checkpointer(const CheckpointerOptions& options)
    : options_(options), device_(kernels::NewCpuDevice()) {}

Checkpointer::~Checkpointer() {
  stop_watching_ = true;
  if (watcher_.joinable()) watcher_.join();
  saves_.reset();  // the copy in flight, and the hand-overs still queued
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
  if (const char* hash = std::getenv("CKPT_HASH_STAGED");
      hash != nullptr && *hash != '\0') {
    const std::string h = hash;
    if (h != "0" && h != "1") {
      return absl::InvalidArgumentError(
          absl::StrCat("CKPT_HASH_STAGED is \"", h, "\"; it must be 0 or 1"));
    }
    options.hash_staged_chunks = h == "1";
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
  } else if (options.device == DeviceKind::kCpuQueued) {
    ckpt->device_ = kernels::NewQueuedCpuDevice();
  }
  if (!ckpt->device_->host_resident() || ckpt->device_->queues_copies()) {
    ckpt->stager_ = std::make_unique<DeviceStager>(
        ckpt->device_.get(),
        DeviceStager::Options{options.gather_max_tensor_bytes,
                              options.gather_buffer_bytes});
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(io::UnixSocketTarget(options.socket_path),
                                grpc::InsecureChannelCredentials(), args);
  ckpt->rpc_ =
      std::make_shared<Rpc>(channel, options.rpc_timeout, options.socket_path);
  ckpt->saves_ = std::make_unique<SaveStager>(
      SaveStager::Context{ckpt->options_, ckpt->rpc_, *ckpt->device_,
                          ckpt->stager_.get(), ckpt->items_, ckpt->failures_});
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
  for (const RegisteredItem& other : items_) {
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
  RegisteredItem r;
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
  if (device_->host_resident() &&
      options_.host_snapshot == HostSnapshot::kFork && data != nullptr) {
    AdviseHugePages(data, size);
  }
  items_.push_back(std::move(r));
  saves_->Registered();
  Attach();
  return absl::OkStatus();
}

void Checkpointer::Attach() {
  // A reader (a tool, an evaluation) is not one of the job's trainers.
  if (options_.read_only) return;
  if (session_ == nullptr) {
    session_ =
        std::make_unique<DaemonSession>(channel_, options_.job, options_.rank);
  }
}

absl::Status Checkpointer::RegisterBytes(const std::string& name,
                                         std::string* value) {
  RETURN_IF_ERROR(CheckNewName(name));
  RegisteredItem r;
  r.item.set_name(name);
  r.item.set_kind(proto::ITEM_KIND_BYTES);
  r.bytes = value;
  items_.push_back(std::move(r));
  Attach();
  return absl::OkStatus();
}

absl::Status Checkpointer::MarkRankLocal(const std::string& name) {
  for (RegisteredItem& r : items_) {
    if (r.item.name() != name) continue;
    if (!r.is_tensor()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", name, "\" is a byte item: those are never compared"));
    }
    r.rank_local = true;
    return absl::OkStatus();
  }
  return absl::NotFoundError(
      absl::StrCat("no tensor \"", name, "\" is registered"));
}

absl::Status Checkpointer::LastSaveError() { return failures_->Take(); }

absl::StatusOr<std::shared_ptr<SaveHandle>> Checkpointer::SaveAsync(
    uint64_t step) {
  return saves_->Save(step);
}

CheckpointerStats Checkpointer::stats() const { return saves_->stats(); }

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

absl::StatusOr<std::vector<proto::ReplicaCheck>> Checkpointer::SuspectSteps() {
  proto::ListCommitsRequest req;
  req.set_job(options_.job);
  proto::ListCommitsResponse resp;
  RETURN_IF_ERROR(rpc_->Call(&proto::CkptDaemon::Stub::ListCommits, req, &resp,
                             "listing suspect steps"));
  return std::vector<proto::ReplicaCheck>(resp.suspects().begin(),
                                          resp.suspects().end());
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
