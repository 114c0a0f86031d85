// The private parts of Checkpointer that its implementation files share
// (checkpointer.cc: connecting, registering, saving; checkpointer_restore.cc:
// restoring as saved; checkpointer_reshard.cc: restoring onto another layout).
// Not for use outside client/.
//
// Thread-safety: as Checkpointer's (see checkpointer.h).
#ifndef CKPT_CLIENT_CHECKPOINTER_INTERNAL_H_
#define CKPT_CLIENT_CHECKPOINTER_INTERNAL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "io/file_system.h"
#include "kernels/device.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {

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
