// Which copy of a shard this node serves to a peer that asks for it, and how
// big it is as it leaves: a copy in memory (a replica held, or one fetched or
// rebuilt here for a restore) before this node's own shard file, always in
// its self-contained form.
#ifndef CKPT_DAEMON_SERVER_SERVED_COPY_H_
#define CKPT_DAEMON_SERVER_SERVED_COPY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/peer/replica_store.h"
#include "daemon/peer/replicator.h"
#include "daemon/service/checkpoint_service.h"
#include "io/file_system.h"
#include "proto/daemon.pb.h"

namespace ckpt::daemon {

struct ServedCopy {
  proto::Tier tier;  // TIER_PEER (memory) or TIER_LOCAL_DISK
  std::string path;
  uint64_t bytes = 0;               // of its self-contained form
  uint64_t held_manifest_xxh3 = 0;  // in memory: the file as held
  uint64_t held_bytes = 0;
};

// NotFound when this node has no copy of `key`.
absl::StatusOr<ServedCopy> BestServedCopy(io::FileSystem* fs,
                                          Replicator& replicator,
                                          CheckpointService& service,
                                          const ReplicaStore::Key& key);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_SERVED_COPY_H_
