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
#include "snapshot/box.h"
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

// One save on its way into its slot, from SaveAsync to its hand-over
// (checkpointer_save.cc): where the bytes go and what the copier thread
// needs to finish the copy.
struct Checkpointer::PendingSave {
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
  // A device with streams: the event after its copies (null: none queued),
  // and where each item's chunk hashes are in `device_hashes` (-1: not
  // hashed on the device).
  std::shared_ptr<kernels::Event> copied;
  std::vector<int64_t> device_at;
  const uint64_t* device_hashes = nullptr;
  std::shared_ptr<SaveHandle> handle;
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

// One restore onto a layout other than the saved one
// (checkpointer_reshard.cc): the saved ranks, and the pinned halves device
// tensors are assembled in.
struct Checkpointer::Reshard {
  std::string what;              // "restoring job J step S rank R", for errors
  std::vector<SavedRank> saved;  // by saved rank
  std::vector<uint8_t> scratch;  // a saved item's bytes read from its file
  std::unique_ptr<PinnedHalves> staging;  // device tensors only
  uint64_t half_bound = 0;                // the most of a half a slab fills
  size_t sent = 0;                        // halves sent to the device so far
};

// A saved box that overlaps a tensor being resharded, and the saved ranks
// that hold it (replicas of each other), in the order they are tried.
struct Checkpointer::SavedBox {
  struct Replica {
    SavedRank* rank;
    const proto::StagedItem* staged;
  };
  snapshot::Box box;
  std::vector<Replica> replicas;
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
