#include "client/daemon_session.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include "proto/daemon.grpc.pb.h"

namespace ckpt::client {

DaemonSession::DaemonSession(std::shared_ptr<grpc::Channel> channel,
                             std::string job, uint32_t rank)
    : channel_(std::move(channel)), job_(std::move(job)), rank_(rank) {
  thread_ = std::thread([this] { Run(); });
}

DaemonSession::~DaemonSession() {
  // A clean end: the daemon must not take the closing session for a trainer
  // that died. Short: a daemon that is down has no session to end.
  {
    proto::AttachRequest req;
    req.set_job(job_);
    req.set_rank(rank_);
    req.set_pid(static_cast<uint32_t>(::getpid()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(2));
    proto::AttachResponse resp;
    (void)proto::CkptDaemon::NewStub(channel_)->EndSession(&context, req,
                                                           &resp);
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (call_ != nullptr) call_->TryCancel();
  }
  thread_.join();
}

void DaemonSession::Run() {
  std::unique_ptr<proto::CkptDaemon::Stub> stub =
      proto::CkptDaemon::NewStub(channel_);
  proto::AttachRequest req;
  req.set_job(job_);
  req.set_rank(rank_);
  req.set_pid(static_cast<uint32_t>(::getpid()));
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      call_ = &context;
    }
    std::unique_ptr<grpc::ClientReader<proto::AttachResponse>> reader =
        stub->Attach(&context, req);
    proto::AttachResponse resp;
    while (reader->Read(&resp)) {
    }
    (void)reader->Finish();  // the daemon went away or we are stopping
    absl::MutexLock lock(&mu_);
    call_ = nullptr;
    // Attach again once the daemon is back (a restart), soon: until then
    // this trainer's exit or hang goes unseen there.
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                             absl::Milliseconds(200)))
      return;
  }
}

}  // namespace ckpt::client
