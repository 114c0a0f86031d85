// IncrementalBases keeps, for each rank of each job, the manifests of its
// newest persisted shards: the candidates an incremental save may store its
// unchanged chunks in (snapshot/FORMAT.md, format 3). A candidate a persist
// builds on is pinned for that persist's length, so that garbage collection
// keeps its file.
//
// Which candidate a save may use (committed on disk, a chain not too long)
// is the caller's policy; here are the candidates and the pins. Pinning and
// a collection's dropping of records meet under one lock: Pin checks that
// the base's file is still there under it, and a collection drops records
// inside a Freeze, which holds every pin as it is.
//
// Thread-safety: thread-safe. Lock order: a Freeze (the pin lock) may be
// held while the candidates' lock is taken, never the other way round.
#ifndef CKPT_DAEMON_PERSIST_INCREMENTAL_BASES_H_
#define CKPT_DAEMON_PERSIST_INCREMENTAL_BASES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "snapshot/shard_writer.h"

namespace ckpt::daemon {

class IncrementalBases {
 public:
  using Base = std::shared_ptr<const snapshot::ShardBase>;
  // Candidates kept per rank (its newest persisted shards).
  static constexpr size_t kCandidates = 4;

  // The rank's shard of `step` was persisted as `base`.
  void Remember(const std::string& job, uint32_t rank, uint64_t step, Base base)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The file of a candidate was rewritten (made self-contained): its new
  // manifest, if it is still a candidate.
  void Replace(const std::string& job, uint32_t rank, uint64_t step, Base base)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets the job's candidates (its newer steps are being dropped).
  void Forget(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);
  // The rank's candidates, newest first.
  std::vector<Base> Candidates(const std::string& job, uint32_t rank) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Pins the rank's shard of `step` as a base in use, if `still_there` (run
  // under the pin lock) says its file was not dropped. Returns whether it
  // pinned. Pins count: each Pin needs its Unpin.
  bool Pin(const std::string& job, uint32_t rank, uint64_t step,
           absl::FunctionRef<bool()> still_there) ABSL_LOCKS_EXCLUDED(pin_mu_);
  void Unpin(const std::string& job, uint32_t rank, uint64_t step)
      ABSL_LOCKS_EXCLUDED(pin_mu_);
  // (rank, step) of the job's pinned shards.
  std::set<std::pair<uint32_t, uint64_t>> Pinned(const std::string& job) const
      ABSL_LOCKS_EXCLUDED(pin_mu_);
  // Waits up to `timeout` until the shard is not pinned; Unavailable, naming
  // it, after that.
  absl::Status WaitUnpinned(const std::string& job, uint32_t rank,
                            uint64_t step, absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(pin_mu_);

  // Holds every pin as it is while it lives: what a collection checks with
  // Pinned stays true until its records are updated.
  class ABSL_SCOPED_LOCKABLE Freeze {
   public:
    explicit Freeze(const IncrementalBases& bases)
        ABSL_EXCLUSIVE_LOCK_FUNCTION(bases.pin_mu_);
    ~Freeze() ABSL_UNLOCK_FUNCTION();
    Freeze(const Freeze&) = delete;
    Freeze& operator=(const Freeze&) = delete;
    bool Pinned(const std::string& job, uint32_t rank, uint64_t step) const;

   private:
    const IncrementalBases& bases_;
  };

 private:
  mutable absl::Mutex pin_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // (job, rank, step) -> how many persists build on it.
  std::map<std::tuple<std::string, uint32_t, uint64_t>, int> pinned_
      ABSL_GUARDED_BY(pin_mu_);
  mutable absl::Mutex mu_;
  // (job, rank) -> step -> base, kCandidates at most.
  std::map<std::pair<std::string, uint32_t>, std::map<uint64_t, Base>> bases_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PERSIST_INCREMENTAL_BASES_H_
