// The daemon's read-only face for the operator's tools (`ckpt ls`, inspect,
// verify, export, status, gc --dry-run): what they may know of a ckptd data
// directory without ckptd, and the names ckptd's records and flags use.
// Nothing here writes; tools/ includes no other daemon header (checked by
// cmake/check_layers.cmake).
//
// DataDirReader opens a data directory's catalog and commit records
// read-only (RocksDB takes no lock for that, so it works while ckptd runs and
// sees the state as of the open).
//
// Thread-safety: one thread at a time per DataDirReader; the functions are
// thread-safe.
#ifndef CKPT_DAEMON_API_DATA_DIR_READER_H_
#define CKPT_DAEMON_API_DATA_DIR_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "proto/catalog.pb.h"
#include "proto/daemon.pb.h"
#include "proto/peer.pb.h"
#include "snapshot/manifest_seal.h"

namespace ckpt::daemon {
class KvStore;
class Catalog;
class EmbeddedCoordinator;
}  // namespace ckpt::daemon

namespace ckpt::daemon::api {

class DataDirReader {
 public:
  // NotFound naming `data_dir` when it holds no ckptd catalog.
  static absl::StatusOr<std::unique_ptr<DataDirReader>> Open(
      const std::string& data_dir);
  ~DataDirReader();
  DataDirReader(const DataDirReader&) = delete;
  DataDirReader& operator=(const DataDirReader&) = delete;

  absl::StatusOr<std::vector<proto::JobRecord>> Jobs();
  absl::StatusOr<absl::optional<proto::JobRecord>> Job(const std::string& job);
  absl::StatusOr<std::vector<proto::ShardRecord>> Shards(
      const std::string& job);
  // The commit records of the embedded coordinator (a single node's).
  absl::StatusOr<std::vector<proto::CommitRecord>> Commits(
      const std::string& job);
  // The seal keys of the cluster key the embedded coordinator keeps (a
  // single node's ckptd started without --cluster-key); null: none there.
  absl::StatusOr<std::shared_ptr<const snapshot::SealKeys>> ClusterKeys();

 private:
  explicit DataDirReader(std::unique_ptr<KvStore> store);

  std::unique_ptr<KvStore> store_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<EmbeddedCoordinator> coordinator_;
};

// What a collection of `shards` and `commits` with ckptd's rules would drop
// keeping the newest `keep_disk` steps on disk and `keep_memory` in memory
// (the same plan ckptd applies; `ckpt gc --dry-run` without a daemon).
std::vector<proto::DroppedCopy> PlanCollection(
    const std::vector<proto::CommitRecord>& commits,
    const std::vector<proto::ShardRecord>& shards, int keep_disk,
    int keep_memory);

// One parity block a node holds for its peers, checked: it must be its
// group's stripe long and, when complete, hash as it did when its last
// contribution arrived.
struct ParityBlockCheck {
  proto::ParityBlockKey key;
  std::string path;
  bool complete = false;
  std::vector<std::string> problems;  // empty: intact
};
// The parity blocks of `job` (of `step` only, when given) under a replica
// directory (ckptd's --peer-dir).
std::vector<ParityBlockCheck> VerifyParityBlocks(const std::string& replica_dir,
                                                 const std::string& job,
                                                 absl::optional<uint64_t> step);

// "memory", "peer", "local_disk", "shared".
std::string TierName(proto::Tier tier);
absl::StatusOr<proto::Tier> ParseTier(absl::string_view name);
// The data directory ckptd uses when none is given.
std::string DefaultDataDir();

}  // namespace ckpt::daemon::api

#endif  // CKPT_DAEMON_API_DATA_DIR_READER_H_
