// DataDirView is how the `ckpt` command reads a ckptd data directory: the
// catalog and commit records opened read-only (RocksDB takes no lock for that,
// so it works while ckptd runs and sees the state as of the open), the step
// summaries `ckpt ls` prints, and the checks of every tier that holds a shard
// (`ckpt verify`). Errors for a missing directory, job or step name what was
// asked for and what exists.
//
// Thread-safety: one thread at a time.
#ifndef CKPT_TOOLS_DATA_DIR_VIEW_H_
#define CKPT_TOOLS_DATA_DIR_VIEW_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/optional.h"
#include "daemon/api/data_dir_reader.h"
#include "proto/catalog.pb.h"

namespace ckpt::tools {

// One step of a job as `ckpt ls` shows it.
struct StepSummary {
  uint64_t step = 0;
  uint32_t world_size = 0;
  uint32_t ranks_in_memory = 0;  // shards with a staging slot
  uint32_t ranks_on_disk = 0;    // persisted shard files
  uint32_t ranks_on_peers = 0;   // persisted shards K peers verified
  uint32_t ranks_failed = 0;
  std::vector<proto::Tier> committed;  // tiers with a commit record
  uint64_t raw_bytes = 0;              // of the persisted shards
  uint64_t stored_bytes = 0;
  int64_t newest_unix_micros = 0;  // last staged, persisted or committed
};

// What a ckptd records of itself in its data directory when it starts
// (<data-dir>/ckptd.json): where it listens and where its other tiers are.
struct DaemonRecord {
  std::string socket;
  std::string node_id;
  std::string staging_dir;
  std::string replica_dir;  // empty: no peer service
  std::string shared_dir;   // empty: no shared tier
};

// The record ckptd left in `data_dir`; nullopt when there is none (no daemon
// started there, or one older than the record).
absl::optional<DaemonRecord> ReadDaemonRecord(const std::string& data_dir);

// One problem `ckpt verify` found, or one shard copy it checked.
struct TierCheck {
  // "memory", "local_disk", "peer", "shared", or "parity": a parity block
  // this node holds for its peers (group and block set, rank unused).
  std::string tier;
  uint64_t step = 0;
  uint32_t rank = 0;
  std::string path;
  uint64_t chunks = 0;                // checked
  std::vector<std::string> problems;  // empty: intact
  int group = -1;
  int block = -1;
};

class DataDirView {
 public:
  static absl::StatusOr<std::unique_ptr<DataDirView>> Open(
      const std::string& data_dir);

  const std::string& data_dir() const { return data_dir_; }
  // Nullopt when no ckptd recorded itself here (one older than the record).
  const absl::optional<DaemonRecord>& daemon() const { return daemon_; }
  absl::StatusOr<std::vector<proto::JobRecord>> Jobs();
  // NotFound naming the job and the jobs there are.
  absl::StatusOr<proto::JobRecord> Job(const std::string& job);
  absl::StatusOr<std::vector<proto::ShardRecord>> Shards(
      const std::string& job);
  absl::StatusOr<std::vector<proto::CommitRecord>> Commits(
      const std::string& job);
  // Installs for this process the cluster key this data directory's
  // embedded coordinator keeps (the key a single node's ckptd made, started
  // without --cluster-key), so that every manifest read is checked against
  // it; returns its id, or nullopt when there is none.
  absl::StatusOr<absl::optional<std::string>> InstallClusterKey();
  // The steps of `job` this node has shards or commit records of; `commits`,
  // when given, replaces the data directory's commit records (those of a
  // running ckptd's coordinator, etcd's for a node of a cluster).
  absl::StatusOr<std::vector<StepSummary>> Steps(
      const std::string& job,
      const std::vector<proto::CommitRecord>* commits = nullptr);
  // The shards of one step by rank; NotFound naming the job, the step and the
  // steps there are.
  absl::StatusOr<std::vector<proto::ShardRecord>> StepShards(
      const std::string& job, uint64_t step);

  // Checks every copy of a shard: the persisted file chunk by chunk, and the
  // memory-tier slot against the file's per-chunk checksums (a slot whose
  // shard is not persisted yet has nothing to be checked against and is
  // reported with 0 chunks checked).
  std::vector<TierCheck> Verify(const proto::ShardRecord& shard);
  // Checks the copies of `job` (of `step` only, when given) in this node's
  // other tiers, as the daemon recorded them: the replicas it holds for
  // peers, and the shared tier's copies (every node's). Each file chunk by
  // chunk, and its manifest must name the job, step and rank of its name.
  std::vector<TierCheck> VerifyBeyond(const std::string& job,
                                      absl::optional<uint64_t> step);

 private:
  DataDirView(std::string data_dir,
              std::unique_ptr<daemon::api::DataDirReader> reader);

  const std::string data_dir_;
  absl::optional<DaemonRecord> daemon_;
  std::unique_ptr<daemon::api::DataDirReader> reader_;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_DATA_DIR_VIEW_H_
