// ReplicaStore keeps whole shard files that came from other nodes, in one
// directory on tmpfs (memory): the replicas peers pushed here (tier T1), or the
// shards this node fetched from peers for a restore. A file counts only once it
// is complete and verified: it is received under a ".partial" name, every
// chunk and the manifest are checked (and the manifest must name the expected
// job, step and rank), and only then is it renamed to its final name. Open()
// deletes the partial files a crash left, so a transfer cut short leaves
// nothing behind. The store holds at most `budget_bytes`, counting transfers
// in progress.
//
// A file may be an increment (snapshot/FORMAT.md, format 3 and later): it
// stores chunks in earlier shards of its rank, which must be here already,
// byte for byte the files it names (their manifest checksums), beside it
// under their own names, where readers look for them. It is refused
// otherwise, and a file that a kept increment reads is never dropped before
// it (Drop refuses). Another save of a step replacing such a file makes the
// increments that read it self-contained first. After a restart, an
// increment whose bases are gone is deleted.
//
// Layout: <dir>/<job>/<step:020>-<rank:010>.ckpt
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_PEER_REPLICA_STORE_H_
#define CKPT_DAEMON_PEER_REPLICA_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "io/file_system.h"
#include "proto/catalog.pb.h"
#include "proto/manifest.pb.h"

namespace ckpt::daemon {

class ReplicaStore {
 public:
  struct Key {
    std::string job;
    uint64_t step = 0;
    uint32_t rank = 0;
    bool operator<(const Key& o) const {
      return std::tie(job, step, rank) < std::tie(o.job, o.step, o.rank);
    }
  };
  struct Entry {
    Key key;
    std::string path;
    uint64_t bytes = 0;
    uint64_t manifest_xxh3 = 0;        // its footer's: which file it is
    std::vector<uint64_t> base_steps;  // an increment's bases (same rank)
  };

  // One file being received. Destroyed before Finish(), it deletes what it
  // received and gives its bytes back to the budget.
  class Receiver {
   public:
    ~Receiver();
    // The next bytes of the file; more than announced is an error.
    absl::Status Append(absl::string_view data);
    // Where the bytes not received yet go, for a transfer that writes them
    // in place (a bulk transfer's recv); then Filled(n) for n written.
    absl::Span<uint8_t> Unfilled();
    absl::Status Filled(size_t n);
    // A receiver opened unmapped takes its bytes here instead, at any
    // offsets, from several threads at once (disjoint ranges, each byte
    // once): written, not stored through a mapping, so no page is zeroed
    // before it is filled (a file rebuilt from parity, segment by segment).
    absl::Status WriteAt(uint64_t offset, absl::Span<const uint8_t> bytes);
    // Checks that every announced byte arrived, verifies the shard (its
    // footer and manifest, and with `every_chunk` every chunk), and makes it
    // visible (replacing an older copy of the same shard). A copy whose
    // chunks are verified as they are read (a restore's) may skip them here.
    absl::StatusOr<Entry> Finish(bool every_chunk = true);

   private:
    friend class ReplicaStore;
    Receiver(ReplicaStore* store, Key key, uint64_t bytes);

    ReplicaStore* const store_;
    const Key key_;
    const uint64_t bytes_;
    std::string partial_;
    std::unique_ptr<io::MappedFile> map_;
    absl::Mutex write_mu_;
    // Unmapped: the partial file, until Finish.
    std::unique_ptr<io::WritableFile> file_ ABSL_GUARDED_BY(write_mu_);
    uint64_t received_ = 0;
    bool done_ = false;
  };

  // Creates `dir` (mode 0700) if needed, deletes partial files and adopts the
  // complete ones.
  static absl::StatusOr<std::unique_ptr<ReplicaStore>> Open(
      io::FileSystem* fs, std::string dir, uint64_t budget_bytes);

  // Starts receiving a file of `bytes` bytes; ResourceExhausted when it does
  // not fit in the budget. `mapped`: through a mapping of the file, populated
  // at once (Append, Unfilled and Filled); else through WriteAt.
  absl::StatusOr<std::unique_ptr<Receiver>> Receive(const Key& key,
                                                    uint64_t bytes,
                                                    bool mapped = true);
  absl::optional<Entry> Find(const Key& key) const;
  // Every complete file of `job` (every job when empty), by key.
  std::vector<Entry> List(const std::string& job = "") const;
  // Deletes a file; NotFound if there is none, FailedPrecondition while an
  // increment here stores chunks in it.
  absl::Status Drop(const Key& key);

  uint64_t used_bytes() const;
  uint64_t budget_bytes() const { return budget_; }
  const std::string& dir() const { return dir_; }

  // The shard record a file stands for (state PERSISTED, `shard_path` the
  // file, items from its verified manifest), as GetShard answers it.
  static absl::StatusOr<proto::ShardRecord> RecordOf(io::FileSystem* fs,
                                                     const Entry& entry);

 private:
  ReplicaStore(io::FileSystem* fs, std::string dir, uint64_t budget)
      : fs_(fs), dir_(std::move(dir)), budget_(budget) {}
  std::string PathOf(const Key& key) const;
  void Release(uint64_t bytes);
  // The first base of `m` (an increment of `key`'s rank) this store does not
  // hold as the very file named: FailedPrecondition naming it; OK when all
  // are here.
  absl::Status HasBases(const Key& key, const proto::ShardManifest& m) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes every file here that reads `key`'s (directly or through another)
  // self-contained, newest first, before `key`'s is replaced.
  absl::Status DetachDependents(const Key& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether an increment here stores chunks in `key`'s file.
  bool IsBase(const Key& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  io::FileSystem* const fs_;
  const std::string dir_;
  const uint64_t budget_;
  mutable absl::Mutex mu_;
  std::map<Key, Entry> files_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;  // files and reservations
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_REPLICA_STORE_H_
