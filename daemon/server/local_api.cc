#include "daemon/server/local_api.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/common/grpc_status.h"
#include "daemon/health/failure_log.h"
#include "daemon/publish/publish_service.h"
#include "io/errno_status.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/names.h"

namespace ckpt::daemon {
namespace {

class DaemonService final : public proto::CkptDaemon::Service {
 public:
  DaemonService(CheckpointService* service, io::FaultInjectionFs* faults)
      : service_(service), faults_(faults) {}

  grpc::Status BeginStage(grpc::ServerContext* ctx,
                          const proto::BeginStageRequest* req,
                          proto::BeginStageResponse* resp) override {
    // A wait for memory ends before the trainer's call gives up: a slot
    // reserved for a caller that left would stay behind.
    const absl::Time deadline =
        absl::FromChrono(ctx->deadline()) - absl::Milliseconds(500);
    auto slot = service_->BeginStage(req->shard().job(), req->shard().step(),
                                     req->shard().rank(), req->world_size(),
                                     req->bytes(), deadline);
    if (!slot.ok()) return ToGrpc(slot.status());
    resp->set_slot_path(slot->path);
    resp->set_slot_bytes(slot->bytes);
    resp->set_chunk_size(service_->options().writer.chunk_size);
    return grpc::Status::OK;
  }

  grpc::Status StageComplete(grpc::ServerContext*,
                             const proto::StageCompleteRequest* req,
                             proto::StageCompleteResponse*) override {
    std::vector<proto::StagedItem> items(req->items().begin(),
                                         req->items().end());
    return ToGrpc(service_->StageComplete(
        req->shard().job(), req->shard().step(), req->shard().rank(), items));
  }

  grpc::Status AbortStage(grpc::ServerContext*,
                          const proto::AbortStageRequest* req,
                          proto::AbortStageResponse*) override {
    return ToGrpc(service_->AbortStage(req->shard().job(), req->shard().step(),
                                       req->shard().rank()));
  }

  grpc::Status WaitCommitted(grpc::ServerContext*,
                             const proto::WaitCommittedRequest* req,
                             proto::WaitCommittedResponse* resp) override {
    auto commit =
        service_->WaitCommitted(req->job(), req->step(), req->tier(),
                                absl::Milliseconds(req->timeout_ms()));
    if (!commit.ok()) return ToGrpc(commit.status());
    *resp->mutable_commit() = *commit;
    return grpc::Status::OK;
  }

  grpc::Status LatestCommitted(grpc::ServerContext*,
                               const proto::LatestCommittedRequest* req,
                               proto::LatestCommittedResponse* resp) override {
    auto latest = service_->LatestCommitted(req->job(), req->tier(),
                                            req->include_suspect());
    if (!latest.ok()) return ToGrpc(latest.status());
    resp->set_found(latest->has_value());
    if (latest->has_value()) resp->set_step(**latest);
    return grpc::Status::OK;
  }

  grpc::Status ListCommits(grpc::ServerContext*,
                           const proto::ListCommitsRequest* req,
                           proto::ListCommitsResponse* resp) override {
    auto commits = req->has_step()
                       ? service_->ListStepCommits(req->job(), req->step())
                       : service_->ListCommits(req->job());
    if (!commits.ok()) return ToGrpc(commits.status());
    auto suspects = service_->SuspectSteps(req->job(), *commits);
    if (!suspects.ok()) return ToGrpc(suspects.status());
    for (proto::CommitRecord& c : *commits) *resp->add_commits() = std::move(c);
    for (proto::ReplicaCheck& c : *suspects)
      *resp->add_suspects() = std::move(c);
    return grpc::Status::OK;
  }

  grpc::Status GetShard(grpc::ServerContext*, const proto::GetShardRequest* req,
                        proto::GetShardResponse* resp) override {
    // A rank that asks about its shards (a restore, a wait for its last
    // step) is not hung.
    service_->hangs()->Alive(req->shard().job(), req->shard().rank(),
                             absl::Now());
    auto shard = service_->GetShard(req->shard().job(), req->shard().step(),
                                    req->shard().rank(), req->on_demand());
    if (!shard.ok()) return ToGrpc(shard.status());
    *resp->mutable_shard() = *shard;
    return grpc::Status::OK;
  }

  grpc::Status LandRange(grpc::ServerContext*,
                         const proto::LandRangeRequest* req,
                         proto::LandRangeResponse*) override {
    return ToGrpc(service_->LandRange(*req));
  }

  grpc::Status OfferPeerShard(grpc::ServerContext*,
                              const proto::GetShardRequest* req,
                              proto::PeerShardOffer* resp) override {
    auto offer = service_->OfferPeerShard(
        req->shard().job(), req->shard().step(), req->shard().rank());
    if (!offer.ok()) return ToGrpc(offer.status());
    *resp = *std::move(offer);
    return grpc::Status::OK;
  }

  grpc::Status FindShard(grpc::ServerContext*,
                         const proto::FindShardRequest* req,
                         proto::FindShardResponse* resp) override {
    auto found = service_->FindShard(req->shard().job(), req->shard().step(),
                                     req->shard().rank());
    if (!found.ok()) return ToGrpc(found.status());
    *resp = *std::move(found);
    return grpc::Status::OK;
  }

  grpc::Status ReportRestore(grpc::ServerContext*,
                             const proto::ReportRestoreRequest* req,
                             proto::ReportRestoreResponse*) override {
    return ToGrpc(service_->ReportRestore(*req));
  }

  grpc::Status CollectGarbage(grpc::ServerContext*,
                              const proto::CollectGarbageRequest* req,
                              proto::CollectGarbageResponse* resp) override {
    if (req->memory()) {
      auto drop = service_->DropMemoryCopies(req->job(), req->dry_run());
      if (!drop.ok()) return ToGrpc(drop.status());
      for (const proto::ShardRecord& r : drop->dropped) {
        proto::DroppedCopy* d = resp->add_dropped();
        d->set_step(r.step());
        d->set_rank(r.rank());
        d->set_slot_path(r.slot_path());
        d->set_forgotten(r.shard_path().empty());
      }
      for (const auto& [r, why] : drop->kept) {
        proto::KeptCopy* k = resp->add_kept();
        k->set_step(r.step());
        k->set_rank(r.rank());
        k->set_reason(why);
      }
      return grpc::Status::OK;
    }
    RetentionPolicy policy{static_cast<int>(req->keep_disk()),
                           req->keep_memory() == 0
                               ? service_->options().keep_memory_steps
                               : static_cast<int>(req->keep_memory())};
    auto plan = service_->CollectGarbage(req->job(), policy, req->dry_run());
    if (!plan.ok()) return ToGrpc(plan.status());
    for (const RetentionAction& a : plan->actions) {
      *resp->add_dropped() = ToProto(a);
    }
    return grpc::Status::OK;
  }

  grpc::Status RollBack(grpc::ServerContext*, const proto::RollBackRequest* req,
                        proto::RollBackResponse* resp) override {
    auto record = service_->RollBack(req->job(), req->step(), req->into(),
                                     req->discard_newer());
    if (!record.ok()) return ToGrpc(record.status());
    *resp->mutable_record() = *std::move(record);
    return grpc::Status::OK;
  }

  grpc::Status Rendezvous(grpc::ServerContext*,
                          const proto::RendezvousRequest* req,
                          proto::RendezvousResponse* resp) override {
    auto epoch = service_->coordinator()->Rendezvous(
        req->job(), req->participant(), req->min_members(), req->max_members(),
        absl::Milliseconds(req->settle_ms()),
        absl::Milliseconds(std::min<uint32_t>(req->timeout_ms(), 3600000)),
        req->resume_tier());
    if (!epoch.ok()) return ToGrpc(epoch.status());
    *resp->mutable_epoch() = *std::move(epoch);
    return grpc::Status::OK;
  }

  grpc::Status WatchMembers(grpc::ServerContext*,
                            const proto::WatchMembersRequest* req,
                            proto::WatchMembersResponse* resp) override {
    const absl::Duration timeout =
        absl::Milliseconds(std::min<uint32_t>(req->timeout_ms(), 60000));
    auto m =
        service_->coordinator()->WatchMembers(req->after_revision(), timeout);
    if (!m.ok()) return ToGrpc(m.status());
    for (const std::string& n : m->nodes) resp->add_nodes(n);
    resp->set_revision(m->revision);
    return grpc::Status::OK;
  }

  grpc::Status Attach(
      grpc::ServerContext* ctx, const proto::AttachRequest* req,
      grpc::ServerWriter<proto::AttachResponse>* writer) override {
    if (absl::Status valid = snapshot::ValidateJobId(req->job()); !valid.ok())
      return ToGrpc(valid);
    JobActivity* activity = service_->activity();
    activity->Attach(req->job());
    const absl::Time attached = absl::Now();
    service_->goodput()->SessionBegun(
        req->job(), req->pid(), attached,
        ProcessStart(req->pid()).value_or(attached));
    service_->hangs()->SessionBegun(req->job(), req->rank(), req->pid(),
                                    attached);
    CKPT_LOG_DEBUG("job {} rank {} (pid {}) attached", req->job(), req->rank(),
                   req->pid());
    // Held until the trainer's Checkpointer goes (or its process dies, which
    // closes the connection) or the server shuts down: both cancel the call.
    writer->Write(proto::AttachResponse());
    while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(50));
    activity->Detach(req->job());
    CKPT_LOG_DEBUG("job {} rank {} (pid {}) detached", req->job(), req->rank(),
                   req->pid());
    const absl::Time closed = absl::Now();
    service_->hangs()->SessionEnded(req->job(), req->rank(), req->pid());
    if (!TakeCleanEnd(*req)) {
      NoteTrainerExit(*req, attached, closed);
      service_->goodput()->SessionEnded(req->job(), req->pid(), closed,
                                        /*clean=*/false);
    }
    return grpc::Status::OK;
  }

  grpc::Status EndSession(grpc::ServerContext*, const proto::AttachRequest* req,
                          proto::AttachResponse*) override {
    {
      absl::MutexLock lock(&ended_mu_);
      // A Checkpointer whose session never reached this daemon leaves its
      // mark behind: bounded.
      if (ended_.size() >= kEndedKept) ended_.clear();
      ended_.insert({req->job(), req->pid()});
    }
    // Its session may have been with an earlier ckptd (this one restarted
    // since): the job's clock learns of the end here.
    service_->goodput()->SessionEnded(req->job(), req->pid(), absl::Now(),
                                      /*clean=*/true);
    return grpc::Status::OK;
  }

  grpc::Status ListFailures(grpc::ServerContext*,
                            const proto::ListFailuresRequest* req,
                            proto::ListFailuresResponse* resp) override {
    for (proto::FailureRecord& r : service_->failures()->Timeline(req->job()))
      *resp->add_failures() = std::move(r);
    return grpc::Status::OK;
  }

  grpc::Status GetMetrics(grpc::ServerContext*, const proto::GetMetricsRequest*,
                          proto::GetMetricsResponse* resp) override {
    resp->set_text(service_->metrics()->Render());
    return grpc::Status::OK;
  }

  grpc::Status Describe(grpc::ServerContext*, const proto::DescribeRequest*,
                        proto::DescribeResponse* resp) override {
    const ServiceOptions& o = service_->options();
    std::error_code ec;
    auto absolute = [&ec](const std::string& p) {
      return p.empty() ? p : std::filesystem::absolute(p, ec).string();
    };
    resp->set_data_dir(absolute(o.data_dir));
    resp->set_staging_dir(absolute(o.staging.dir));
    resp->set_replica_dir(absolute(o.replication.dir));
    resp->set_shared_dir(absolute(o.shared.dir));
    resp->set_node_id(o.replication.node_id);
    return grpc::Status::OK;
  }

  grpc::Status InjectFaults(grpc::ServerContext*,
                            const proto::InjectFaultsRequest* req,
                            proto::InjectFaultsResponse*) override {
    if (faults_ == nullptr) {
      return ToGrpc(absl::FailedPreconditionError(
          "fault injection is off: start ckptd with --fault-injection"));
    }
    if (!req->power_loss_plan().empty()) {
      absl::StatusOr<std::string> plan = faults_->CutPower();
      if (!plan.ok()) return ToGrpc(plan.status());
      CKPT_LOG_WARN("ckptd: the power is out (injected); plan in {}",
                    req->power_loss_plan());
      return ToGrpc(io::WriteStringToFile(io::DefaultFileSystem(),
                                          req->power_loss_plan(), *plan));
    }
    if (req->write_errno() < 0 || req->fsync_errno() < 0) {
      return ToGrpc(absl::InvalidArgumentError("errno values are positive"));
    }
    CKPT_LOG_WARN(
        "ckptd: injecting disk faults: write errno {}, fsync errno {}, "
        "write throughput {} bytes/s (0: full speed)",
        req->write_errno(), req->fsync_errno(), req->write_bytes_per_second());
    faults_->SetPersistentFaults(req->write_errno(), req->fsync_errno());
    faults_->SetWriteThroughput(req->write_bytes_per_second());
    return grpc::Status::OK;
  }

 private:
  // The trainer ended this session itself (EndSession); forgotten now.
  bool TakeCleanEnd(const proto::AttachRequest& req) {
    absl::MutexLock lock(&ended_mu_);
    return ended_.erase({req.job(), req.pid()}) > 0;
  }
  // A session closed without EndSession: a trainer whose process is gone
  // (looked at for up to half a second: it may still be exiting) exited.
  void NoteTrainerExit(const proto::AttachRequest& req, absl::Time attached,
                       absl::Time closed) {
    std::string how;
    for (int i = 0; i < 10; ++i) {
      how = TrainerExit(req.pid());
      if (!how.empty()) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (how.empty()) return;
    const std::string detail =
        absl::StrCat("rank ", req.rank(), " (pid ", req.pid(), ") ", how);
    CKPT_LOG_WARN("job {}: trainer {}", req.job(), detail);
    service_->failures()->Failed(req.job(), "trainer_exited", detail,
                                 /*incident=*/true, closed,
                                 static_cast<int>(req.rank()), attached);
  }

  CheckpointService* const service_;
  io::FaultInjectionFs* const faults_;
  static constexpr size_t kEndedKept = 4096;
  absl::Mutex ended_mu_;
  std::set<std::pair<std::string, uint32_t>> ended_ ABSL_GUARDED_BY(ended_mu_);
};

absl::Status Errno(absl::string_view what) {
  return io::ErrnoToStatus(errno, what);
}

// The socket's directory is ours and private; an existing socket path must be a
// stale socket.
absl::Status PrepareSocketPath(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path ", path, " is longer than ",
                     sizeof(sockaddr_un{}.sun_path) - 1, " bytes"));
  }
  std::string dir = io::DirName(path);
  RETURN_IF_ERROR(io::DefaultFileSystem()->CreateDirs(dir));
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return Errno(absl::StrCat("stat ", dir));
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("socket directory ", dir,
                     " must be a directory owned by uid ", ::geteuid()));
  }
  if (::chmod(dir.c_str(), 0700) != 0)
    return Errno(absl::StrCat("chmod 0700 ", dir));
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "refusing to replace ", path, ": it exists and is not a socket",
          S_ISLNK(st.st_mode) ? " (a symlink)" : ""));
    }
    if (::unlink(path.c_str()) != 0)
      return Errno(absl::StrCat("remove stale socket ", path));
  } else if (errno != ENOENT) {
    return Errno(absl::StrCat("stat ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalApiServer>> LocalApiServer::Start(
    CheckpointService* service, const LocalApiOptions& options) {
  RETURN_IF_ERROR(PrepareSocketPath(options.socket_path));
  std::unique_ptr<LocalApiServer> server(new LocalApiServer());
  server->socket_path_ = options.socket_path;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  server->listen_fd_ = fd;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, options.socket_path.c_str(),
               sizeof(addr.sun_path) - 1);
  // Created with mode 0600 from the start: no window in which another user
  // could connect.
  mode_t old_mask = ::umask(0177);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::umask(old_mask);
  if (rc != 0) return Errno(absl::StrCat("bind ", options.socket_path));
  if (::listen(fd, 128) != 0)
    return Errno(absl::StrCat("listen ", options.socket_path));
  if (::pipe2(server->wake_fd_, O_CLOEXEC) != 0) return Errno("pipe");

  server->service_ = std::make_unique<DaemonService>(service, options.faults);
  grpc::ServerBuilder builder;
  builder.RegisterService(server->service_.get());
  server->publish_ = std::make_unique<PublishService>(
      service->publisher(), [service](const std::string& topic) {
        return service->Subscribe(topic);
      });
  builder.RegisterService(server->publish_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr)
    return absl::InternalError("gRPC server did not start");
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  CKPT_LOG_INFO("ckptd: serving on {}", options.socket_path);
  return server;
}

void LocalApiServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      CKPT_LOG_ERROR("ckptd: poll on {}: {}", socket_path_,
                     std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    int conn =
        ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) continue;
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        cred.uid != ::geteuid()) {
      ++refused_;
      CKPT_LOG_WARN(
          "ckptd: refused a connection from uid {} (pid {}): only uid {} may "
          "use {}",
          cred.uid, cred.pid, ::geteuid(), socket_path_);
      ::close(conn);
      continue;
    }
    grpc::AddInsecureChannelFromFd(server_.get(), conn);
  }
}

LocalApiServer::~LocalApiServer() {
  if (wake_fd_[1] >= 0) {
    char c = 0;
    (void)!::write(wake_fd_[1], &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(socket_path_.c_str());
  }
  for (int fd : wake_fd_) {
    if (fd >= 0) ::close(fd);
  }
}

}  // namespace ckpt::daemon
