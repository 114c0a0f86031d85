// LandedCopies: shards of the shared tier brought from an object store to
// this node's disk, so that a restoring trainer reads them as it reads any
// shard file. A landed copy is the self-contained form of the tier's copy
// (an increment's chunks read from its bases in the store), written under a
// temporary name and renamed into <dir>/<job>/<step>-<rank>-<manifest>.ckpt,
// named by the tier copy's manifest checksum: a step saved again lands
// anew, never read from the copy of the save before. Every chunk is checked
// by the reader that reads it (the trainer's restore).
//
// Thread-safety: thread-safe; landings of different copies run at once, a
// copy being landed is waited for by the others who want it.
#ifndef CKPT_DAEMON_PEER_LANDED_COPIES_H_
#define CKPT_DAEMON_PEER_LANDED_COPIES_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"

namespace ckpt::daemon {

class LandedCopies {
 public:
  LandedCopies(io::FileSystem* local, std::string dir);

  // The local path of the copy at `path` in `store` of (job, step, rank),
  // landed now unless this very copy was before.
  absl::StatusOr<std::string> Land(io::FileSystem* store,
                                   const std::string& path,
                                   const std::string& job, uint64_t step,
                                   uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes the landed copies of `job`'s steps older than `oldest_kept`.
  void Forget(const std::string& job, uint64_t oldest_kept)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  io::FileSystem* const local_;
  const std::string dir_;
  absl::Mutex mu_;
  std::set<std::string> landing_ ABSL_GUARDED_BY(mu_);  // their final paths
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_LANDED_COPIES_H_
