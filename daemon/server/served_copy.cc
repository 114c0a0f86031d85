#include "daemon/server/served_copy.h"

#include "absl/strings/str_cat.h"
#include "daemon/common/describe.h"
#include "io/status_macros.h"
#include "snapshot/self_contained.h"

namespace ckpt::daemon {

absl::StatusOr<ServedCopy> BestServedCopy(io::FileSystem* fs,
                                          Replicator& replicator,
                                          CheckpointService& service,
                                          const ReplicaStore::Key& key) {
  for (ReplicaStore* store : {replicator.held(), replicator.fetched()}) {
    if (absl::optional<ReplicaStore::Entry> e = store->Find(key)) {
      ServedCopy copy{proto::TIER_PEER, e->path, e->bytes, e->manifest_xxh3,
                      e->bytes};
      if (!e->base_steps.empty()) {
        // An increment held with its bases: it leaves self-contained.
        ASSIGN_OR_RETURN(snapshot::SelfContained view,
                         snapshot::OpenSelfContained(fs, e->path));
        copy.bytes = view.size;
      }
      return copy;
    }
  }
  ASSIGN_OR_RETURN(absl::optional<std::string> own,
                   service.LocalShardFile(key.job, key.step, key.rank));
  if (own.has_value()) {
    // As it leaves the node: self-contained (an incremental save's chunks
    // in its bases included).
    ASSIGN_OR_RETURN(snapshot::SelfContained view,
                     snapshot::OpenSelfContained(fs, *own));
    return ServedCopy{proto::TIER_LOCAL_DISK, *own, view.size};
  }
  return absl::NotFoundError(
      absl::StrCat("this node has no copy of ", Describe(key)));
}

}  // namespace ckpt::daemon
