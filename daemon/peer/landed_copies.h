// LandedCopies: shards of the shared tier brought from an object store into
// this node's memory tier (a directory in the staging tmpfs), so that a
// restoring trainer reads them as it reads any shard file, at memory speed.
// A landed copy is the self-contained form of the tier's copy (an
// increment's chunks read from its bases in the store), written under a
// temporary name and renamed into <dir>/<job>/<step>-<rank>-<manifest>.ckpt,
// named by the tier copy's manifest checksum: a step saved again lands
// anew, never read from the copy of the save before. Every chunk is checked
// by the reader that reads it (the trainer's restore).
//
// Landed copies are a cache in memory, held to `budget_bytes`: a landing
// that would pass it first removes the copies used least recently (a reader
// that has one open keeps reading it; one that has not yet opened it gets
// NotFound and asks again, which lands it again). Retention removes those of
// dropped steps; ckptd's start empties the directory.
//
// Thread-safety: thread-safe; landings of different copies run at once, a
// copy being landed is waited for by the others who want it.
#ifndef CKPT_DAEMON_PEER_LANDED_COPIES_H_
#define CKPT_DAEMON_PEER_LANDED_COPIES_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"

namespace ckpt::daemon {

class LandedCopies {
 public:
  // Empties `dir` (what an earlier ckptd landed is not counted).
  LandedCopies(io::FileSystem* local, std::string dir, uint64_t budget_bytes);

  // The local path of the copy at `path` in `store` of (job, step, rank),
  // landed now unless this very copy is landed already.
  absl::StatusOr<std::string> Land(io::FileSystem* store,
                                   const std::string& path,
                                   const std::string& job, uint64_t step,
                                   uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes the landed copies of `job`'s steps older than `oldest_kept`.
  void Forget(const std::string& job, uint64_t oldest_kept)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes of the copies landed or being landed.
  uint64_t held_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Landed {
    uint64_t bytes = 0;
    uint64_t used = 0;  // when last asked for, in landings and hits
  };
  // Removes the least recently used landed copies until `bytes` more fit.
  void MakeRoom(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  io::FileSystem* const local_;
  const std::string dir_;
  const uint64_t budget_bytes_;
  mutable absl::Mutex mu_;
  std::set<std::string> landing_ ABSL_GUARDED_BY(mu_);  // their final paths
  std::map<std::string, Landed> landed_ ABSL_GUARDED_BY(mu_);
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;  // landed and reserved bytes
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_LANDED_COPIES_H_
