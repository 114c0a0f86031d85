// LandedCopies: shards of the shared tier brought from an object store into
// this node's memory tier (a directory in the staging tmpfs), so that a
// restoring trainer reads them as it reads any shard file, at memory speed.
// A landed copy is the self-contained form of the tier's copy (an
// increment's chunks read from its bases in the store), at
// <dir>/<job>/<step>-<rank>-<manifest>.ckpt, named by the tier copy's
// manifest checksum: a step saved again lands anew, never read from the copy
// of the save before. It lands whole, or on demand (peer/copy_landing.h):
// its footer and manifest at once, then the byte ranges its readers ask for
// (LandRange), read from the store as they are asked for, so that a restore
// streams it chunk by chunk and a resharded restore reads only its boxes.
// Every chunk is checked by the reader that reads it (the trainer's restore).
//
// Landed copies are a cache in memory, held to `budget_bytes` (a copy counts
// whole from its start): a landing that would pass it first removes the
// copies used least recently (a reader that has one open keeps reading what
// landed of it; one that asks for more, or has not yet opened it, gets
// NotFound and asks again, which lands it again). Retention removes those of
// dropped steps; ckptd's start empties the directory.
//
// Thread-safety: thread-safe; landings of different copies run at once, a
// copy being started is waited for by the others who want it.
#ifndef CKPT_DAEMON_PEER_LANDED_COPIES_H_
#define CKPT_DAEMON_PEER_LANDED_COPIES_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/common/metrics.h"
#include "daemon/peer/copy_landing.h"
#include "io/file_system.h"

namespace ckpt::daemon {

class LandedCopies {
 public:
  // Empties `dir` (what an earlier ckptd landed is not counted). The bytes
  // read from stores are counted in `metrics` (when given) as
  // ckpt_shared_landed_bytes_total.
  LandedCopies(io::FileSystem* local, std::string dir, uint64_t budget_bytes,
               Metrics* metrics = nullptr);

  // How a copy lands: whole before Land returns, or on demand.
  enum class How { kWhole, kOnDemand };
  // The local path of the copy at `path` in `store` of (job, step, rank),
  // landed now unless this very copy is landed (or landing) already.
  absl::StatusOr<std::string> Land(io::FileSystem* store,
                                   const std::string& path,
                                   const std::string& job, uint64_t step,
                                   uint32_t rank, How how = How::kWhole)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns once bytes [offset, offset + length) of the copy of (job, step,
  // rank) landed at `local` (by Land) are there; NotFound when no such copy
  // is landed (any more).
  absl::Status LandRange(const std::string& local, const std::string& job,
                         uint64_t step, uint32_t rank, uint64_t offset,
                         uint64_t length) ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes the landed copies of `job`'s steps older than `oldest_kept`.
  void Forget(const std::string& job, uint64_t oldest_kept)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes of the copies landed or being landed.
  uint64_t held_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes read from stores into landed copies since the start.
  uint64_t fetched_bytes() const;

 private:
  struct Landed {
    uint64_t bytes = 0;
    uint64_t used = 0;  // when last asked for, in landings and hits
    std::shared_ptr<CopyLanding> landing;  // until every byte is there
  };
  // The copy at `local` (started if need be) and its landing, null once
  // whole.
  absl::StatusOr<std::shared_ptr<CopyLanding>> Start(io::FileSystem* store,
                                                     const std::string& path,
                                                     const std::string& local)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Lands `range` of `local`'s copy through `landing`; forgets the landing
  // once the copy is whole.
  absl::Status Ensure(const std::string& local,
                      const std::shared_ptr<CopyLanding>& landing,
                      uint64_t offset, uint64_t length)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the least recently used landed copies until `bytes` more fit.
  void MakeRoom(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fetched(uint64_t bytes);

  io::FileSystem* const local_;
  const std::string dir_;
  const uint64_t budget_bytes_;
  Metrics* const metrics_;
  mutable absl::Mutex mu_;
  std::set<std::string> starting_ ABSL_GUARDED_BY(mu_);  // their local paths
  std::map<std::string, Landed> landed_ ABSL_GUARDED_BY(mu_);
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;  // landed and reserved bytes
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> fetched_{0};
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_LANDED_COPIES_H_
