#include "daemon/catalog/catalog.h"

#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "daemon/common/records.h"
#include "io/status_macros.h"

namespace ckpt::daemon {
namespace {

std::string JobKey(const std::string& job) {
  return absl::StrCat("/catalog/jobs/", job);
}

std::string ShardKey(const std::string& job, uint64_t step, uint32_t rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "/%020" PRIu64 "/%010u", step, rank);
  return absl::StrCat("/catalog/shards/", job, buf);
}

template <typename Message>
absl::StatusOr<std::vector<Message>> ScanAll(KvStore* store,
                                             const std::string& prefix) {
  ASSIGN_OR_RETURN(auto entries, store->Scan(prefix));
  std::vector<Message> out;
  for (const auto& [key, bytes] : entries) {
    ASSIGN_OR_RETURN(Message m, ParseRecord<Message>(key, bytes));
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

absl::Status Catalog::PutJob(const proto::JobRecord& job, bool sync) {
  return store_->Put(JobKey(job.job()), job.SerializeAsString(), sync);
}

absl::StatusOr<absl::optional<proto::JobRecord>> Catalog::GetJob(
    const std::string& job) {
  std::string key = JobKey(job);
  ASSIGN_OR_RETURN(auto bytes, store_->Get(key));
  if (!bytes.has_value()) return absl::optional<proto::JobRecord>();
  ASSIGN_OR_RETURN(proto::JobRecord record,
                   ParseRecord<proto::JobRecord>(key, *bytes));
  return absl::optional<proto::JobRecord>(std::move(record));
}

absl::StatusOr<std::vector<proto::JobRecord>> Catalog::ListJobs() {
  return ScanAll<proto::JobRecord>(store_, "/catalog/jobs/");
}

absl::Status Catalog::PutFailureHistory(const proto::FailureHistory& history) {
  return store_->Put(absl::StrCat("/catalog/health/failures/", history.job()),
                     history.SerializeAsString(), /*sync=*/false);
}

absl::StatusOr<std::vector<proto::FailureHistory>>
Catalog::ListFailureHistories() {
  return ScanAll<proto::FailureHistory>(store_, "/catalog/health/failures/");
}

absl::Status Catalog::PutGoodput(const proto::GoodputRecord& record) {
  return store_->Put(absl::StrCat("/catalog/health/goodput/", record.job()),
                     record.SerializeAsString(), /*sync=*/false);
}

absl::StatusOr<std::vector<proto::GoodputRecord>> Catalog::ListGoodput() {
  return ScanAll<proto::GoodputRecord>(store_, "/catalog/health/goodput/");
}

absl::Status Catalog::PutShard(const proto::ShardRecord& shard, bool sync) {
  return store_->Put(ShardKey(shard.job(), shard.step(), shard.rank()),
                     shard.SerializeAsString(), sync);
}

absl::StatusOr<absl::optional<proto::ShardRecord>> Catalog::GetShard(
    const std::string& job, uint64_t step, uint32_t rank) {
  std::string key = ShardKey(job, step, rank);
  ASSIGN_OR_RETURN(auto bytes, store_->Get(key));
  if (!bytes.has_value()) return absl::optional<proto::ShardRecord>();
  ASSIGN_OR_RETURN(proto::ShardRecord record,
                   ParseRecord<proto::ShardRecord>(key, *bytes));
  return absl::optional<proto::ShardRecord>(std::move(record));
}

absl::StatusOr<std::vector<proto::ShardRecord>> Catalog::ListShards(
    const std::string& job) {
  return ScanAll<proto::ShardRecord>(
      store_, job.empty() ? "/catalog/shards/"
                          : absl::StrCat("/catalog/shards/", job, "/"));
}

absl::Status Catalog::DeleteShard(const std::string& job, uint64_t step,
                                  uint32_t rank) {
  return store_->Delete(ShardKey(job, step, rank));
}

absl::Status Catalog::UpdateShards(
    const std::vector<proto::ShardRecord>& put,
    const std::vector<proto::ShardRecord>& forget) {
  KvStore::Batch batch;
  for (const proto::ShardRecord& r : put) {
    batch.puts.emplace_back(ShardKey(r.job(), r.step(), r.rank()),
                            r.SerializeAsString());
  }
  for (const proto::ShardRecord& r : forget) {
    batch.deletes.push_back(ShardKey(r.job(), r.step(), r.rank()));
  }
  return store_->Write(batch);
}

}  // namespace ckpt::daemon
