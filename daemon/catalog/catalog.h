// Catalog: what ckptd knows about jobs and shards (state, slot, shard file,
// sizes), stored in its KvStore so it survives daemon crashes. Typed access
// over these keys:
//   /catalog/jobs/<job>                              JobRecord
//   /catalog/shards/<job>/<step:020>/<rank:010>      ShardRecord
//   /catalog/health/failures/<job>                   FailureHistory
//   /catalog/health/goodput/<job>                    GoodputRecord
//
// Thread-safety: thread-safe; callers serialize read-modify-write of one shard.
#ifndef CKPT_DAEMON_CATALOG_CATALOG_H_
#define CKPT_DAEMON_CATALOG_CATALOG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/optional.h"
#include "daemon/catalog/kv_store.h"
#include "proto/catalog.pb.h"

namespace ckpt::daemon {

class Catalog {
 public:
  explicit Catalog(KvStore* store) : store_(store) {}

  absl::Status PutJob(const proto::JobRecord& job, bool sync = true);
  absl::StatusOr<absl::optional<proto::JobRecord>> GetJob(
      const std::string& job);
  absl::StatusOr<std::vector<proto::JobRecord>> ListJobs();

  // `sync` false: the record may be lost in a crash (used for SHARD_STAGING,
  // which recovery discards anyway).
  absl::Status PutShard(const proto::ShardRecord& shard, bool sync = true);
  absl::StatusOr<absl::optional<proto::ShardRecord>> GetShard(
      const std::string& job, uint64_t step, uint32_t rank);
  // The job's shards ordered by step, then rank; every job's when `job` is
  // empty.
  absl::StatusOr<std::vector<proto::ShardRecord>> ListShards(
      const std::string& job = "");
  absl::Status DeleteShard(const std::string& job, uint64_t step,
                           uint32_t rank);
  // What ckptd saw of a job's health (daemon/health), kept unsynced: a
  // crash may lose the last change.
  absl::Status PutFailureHistory(const proto::FailureHistory& history);
  absl::StatusOr<std::vector<proto::FailureHistory>> ListFailureHistories();
  absl::Status PutGoodput(const proto::GoodputRecord& record);
  absl::StatusOr<std::vector<proto::GoodputRecord>> ListGoodput();

  // Rewrites `put` and deletes `forget`, atomically, with one sync.
  absl::Status UpdateShards(const std::vector<proto::ShardRecord>& put,
                            const std::vector<proto::ShardRecord>& forget);

 private:
  KvStore* const store_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CATALOG_CATALOG_H_
