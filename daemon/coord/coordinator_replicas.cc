// Coordinator's records of replicas compared (health/replica_check.h): each
// rank's digests of a step and the step's verdict, in the step's key space
// (coord/coordinator.h), and the newest step a job may trust.
#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "daemon/common/records.h"
#include "daemon/coord/coordinator.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {

namespace {

std::string DigestsPrefix(const std::string& job, uint64_t step) {
  return StepPrefix(job, step) + "digests/";
}

std::string ReplicasKey(const std::string& job, uint64_t step) {
  return StepPrefix(job, step) + "replicas";
}

}  // namespace

absl::Status Coordinator::PutReplicaDigests(
    const std::string& job, uint64_t step,
    const proto::ReplicaDigests& digests) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  char rank[16];
  std::snprintf(rank, sizeof rank, "%010" PRIu32, digests.rank());
  return StorePut(DigestsPrefix(job, step) + rank, digests.SerializeAsString(),
                  /*ephemeral=*/false);
}

absl::StatusOr<std::vector<proto::ReplicaDigests>>
Coordinator::ListReplicaDigests(const std::string& job, uint64_t step) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  const std::string prefix = DigestsPrefix(job, step);
  ASSIGN_OR_RETURN(auto entries, StoreScan(prefix));
  std::vector<proto::ReplicaDigests> out;
  out.reserve(entries.size());
  for (const auto& [key, bytes] : entries) {
    ASSIGN_OR_RETURN(proto::ReplicaDigests d,
                     ParseRecord<proto::ReplicaDigests>(prefix + key, bytes));
    out.push_back(std::move(d));
  }
  return out;
}

absl::StatusOr<proto::ReplicaCheck> Coordinator::SettleReplicaCheck(
    const proto::ReplicaCheck& check) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(check.job()));
  ASSIGN_OR_RETURN(bool created,
                   StoreCreate(ReplicasKey(check.job(), check.step()),
                               check.SerializeAsString()));
  if (created) return check;
  ASSIGN_OR_RETURN(absl::optional<proto::ReplicaCheck> kept,
                   GetReplicaCheck(check.job(), check.step()));
  if (!kept.has_value()) {
    return absl::AbortedError(absl::StrCat(
        "the replica check of job ", check.job(), " step ", check.step(),
        " went while it was kept (the step was forgotten)"));
  }
  return *kept;
}

absl::StatusOr<absl::optional<proto::ReplicaCheck>>
Coordinator::GetReplicaCheck(const std::string& job, uint64_t step) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  const std::string key = ReplicasKey(job, step);
  ASSIGN_OR_RETURN(absl::optional<std::string> bytes, StoreGet(key));
  if (!bytes.has_value()) return absl::optional<proto::ReplicaCheck>();
  ASSIGN_OR_RETURN(proto::ReplicaCheck check,
                   ParseRecord<proto::ReplicaCheck>(key, *bytes));
  return absl::optional<proto::ReplicaCheck>(std::move(check));
}

absl::StatusOr<absl::optional<uint64_t>> Coordinator::LatestTrusted(
    const std::string& job, proto::Tier tier) {
  ASSIGN_OR_RETURN(absl::optional<uint64_t> latest, LatestCommitted(job, tier));
  if (!latest.has_value()) return latest;
  ASSIGN_OR_RETURN(absl::optional<proto::ReplicaCheck> check,
                   GetReplicaCheck(job, *latest));
  if (!check.has_value() || !check->suspect()) return latest;
  // Rare: walk back through the older commits at the tier.
  ASSIGN_OR_RETURN(std::vector<proto::CommitRecord> commits, ListCommits(job));
  for (auto c = commits.rbegin(); c != commits.rend(); ++c) {
    if (c->tier() != tier || c->step() >= *latest) continue;
    ASSIGN_OR_RETURN(check, GetReplicaCheck(job, c->step()));
    if (!check.has_value() || !check->suspect())
      return absl::optional<uint64_t>(c->step());
  }
  return absl::optional<uint64_t>();
}

}  // namespace ckpt::daemon
