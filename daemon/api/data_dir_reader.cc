#include "daemon/api/data_dir_reader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/catalog/catalog.h"
#include "daemon/catalog/kv_store.h"
#include "daemon/coord/coordinator.h"
#include "daemon/coord/embedded_coordinator.h"
#include "daemon/peer/parity_store.h"
#include "daemon/persist/retention.h"
#include "daemon/server/instance_dirs.h"
#include "io/file_system.h"
#include "io/status_macros.h"

namespace ckpt::daemon::api {

DataDirReader::DataDirReader(std::unique_ptr<KvStore> store)
    : store_(std::move(store)),
      catalog_(std::make_unique<Catalog>(store_.get())),
      coordinator_(std::make_unique<EmbeddedCoordinator>(store_.get())) {}

DataDirReader::~DataDirReader() = default;

absl::StatusOr<std::unique_ptr<DataDirReader>> DataDirReader::Open(
    const std::string& data_dir) {
  const std::string catalog = io::JoinPath(data_dir, "catalog");
  ASSIGN_OR_RETURN(bool exists, io::DefaultFileSystem()->Exists(
                                    io::JoinPath(catalog, "CURRENT")));
  if (!exists) {
    return absl::NotFoundError(
        absl::StrCat("no ckptd catalog in ", data_dir,
                     " (is --data-dir the directory ckptd was started with?)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<KvStore> store,
                   KvStore::OpenReadOnly(catalog));
  return std::unique_ptr<DataDirReader>(new DataDirReader(std::move(store)));
}

absl::StatusOr<std::vector<proto::JobRecord>> DataDirReader::Jobs() {
  return catalog_->ListJobs();
}

absl::StatusOr<absl::optional<proto::JobRecord>> DataDirReader::Job(
    const std::string& job) {
  return catalog_->GetJob(job);
}

absl::StatusOr<std::vector<proto::ShardRecord>> DataDirReader::Shards(
    const std::string& job) {
  return catalog_->ListShards(job);
}

absl::StatusOr<std::vector<proto::CommitRecord>> DataDirReader::Commits(
    const std::string& job) {
  return coordinator_->ListCommits(job);
}

absl::StatusOr<std::shared_ptr<const snapshot::SealKeys>>
DataDirReader::ClusterKeys() {
  ASSIGN_OR_RETURN(absl::optional<proto::ClusterKeyRecord> record,
                   coordinator_->GetClusterKey());
  if (!record.has_value()) return std::shared_ptr<const snapshot::SealKeys>();
  return SealKeysOf(*record);
}

std::vector<proto::DroppedCopy> PlanCollection(
    const std::vector<proto::CommitRecord>& commits,
    const std::vector<proto::ShardRecord>& shards, int keep_disk,
    int keep_memory) {
  std::vector<proto::DroppedCopy> dropped;
  for (const RetentionAction& a :
       PlanRetention(commits, shards, {keep_disk, keep_memory}).actions) {
    dropped.push_back(ToProto(a));
  }
  return dropped;
}

std::vector<ParityBlockCheck> VerifyParityBlocks(
    const std::string& replica_dir, const std::string& job,
    absl::optional<uint64_t> step) {
  std::vector<ParityBlockCheck> checks;
  for (ParityStore::BlockCheck& b :
       ParityStore::Verify(io::DefaultFileSystem(),
                           io::JoinPath(replica_dir, "parity"), job, step)) {
    checks.push_back({std::move(b.key), std::move(b.path), b.complete,
                      std::move(b.problems)});
  }
  return checks;
}

std::string TierName(proto::Tier tier) { return daemon::TierName(tier); }

absl::StatusOr<proto::Tier> ParseTier(absl::string_view name) {
  return daemon::ParseTier(name);
}

std::string DefaultDataDir() { return daemon::DefaultDataDir(); }

}  // namespace ckpt::daemon::api
