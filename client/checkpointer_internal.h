// The private parts of Checkpointer that its implementation files share
// (checkpointer.cc: connecting, registering; checkpointer_restore.cc:
// restoring), and its collaborators (save_stager.h, shard_restorer.h,
// resharder.h, slot_restore.h).
// Not for use outside client/.
//
// Thread-safety: as Checkpointer's (see checkpointer.h).
#ifndef CKPT_CLIENT_CHECKPOINTER_INTERNAL_H_
#define CKPT_CLIENT_CHECKPOINTER_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "client/device_upload.h"
#include "client/fork_snapshot.h"
#include "io/file_system.h"
#include "kernels/device.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {

// The gRPC stub and the deadline every call gets.
class CheckpointerRpc {
 public:
  CheckpointerRpc(std::shared_ptr<grpc::Channel> channel,
                  absl::Duration timeout, std::string socket_path)
      : stub_(proto::CkptDaemon::NewStub(std::move(channel))),
        timeout_(timeout),
        socket_path_(std::move(socket_path)) {}

  const std::string& socket_path() const { return socket_path_; }

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

// A shard whose bytes are whole somewhere: staged (its slot), persisted (its
// file, and maybe its slot), or failed to persist with its slot still there
// (a disk error does not touch the memory tier).
inline bool Restorable(const proto::ShardRecord& shard) {
  return shard.state() == proto::SHARD_STAGED ||
         shard.state() == proto::SHARD_PERSISTED ||
         (shard.state() == proto::SHARD_FAILED && !shard.slot_path().empty());
}

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_CHECKPOINTER_INTERNAL_H_
