// CheckpointService: operations on committed steps. Copying steps into another
// job and rolling a job back to an earlier step (`ckpt restore JOB STEP`,
// `--into JOB2`).
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "daemon/common/describe.h"
#include "daemon/common/records.h"
#include "daemon/service/checkpoint_service.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {

absl::Status CheckpointService::CopySteps(
    const std::string& from, const std::vector<proto::ShardRecord>& shards,
    const std::set<uint64_t>& steps, const std::string& to) {
  // With the shards their chunks lie in (incremental saves), so the copies
  // read alone.
  std::set<std::pair<uint32_t, uint64_t>> wanted;
  for (const proto::ShardRecord& r : shards) {
    if (steps.count(r.step()) == 0) continue;
    wanted.insert({r.rank(), r.step()});
    for (uint64_t base : r.base_steps()) wanted.insert({r.rank(), base});
  }
  std::vector<proto::ShardRecord> copied;
  for (const proto::ShardRecord& r : shards) {
    if (wanted.count({r.rank(), r.step()}) == 0) continue;
    if (r.state() != proto::SHARD_PERSISTED || r.shard_path().empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(from, r.step(), r.rank()),
                       " is not persisted; it cannot be copied to job ", to));
    }
    const std::string path = ShardPath(to, r.step(), r.rank());
    RETURN_IF_ERROR(fs_->CreateDirs(io::DirName(path)));
    ASSIGN_OR_RETURN(bool exists, fs_->Exists(path));
    if (exists) RETURN_IF_ERROR(fs_->Unlink(path));  // a retry after a crash
    // Shard files are immutable: a second name costs nothing.
    RETURN_IF_ERROR(fs_->HardLink(r.shard_path(), path));
    proto::ShardRecord c = r;
    c.set_job(to);
    c.set_shard_path(path);
    c.clear_slot_path();
    c.set_slot_bytes(0);
    copied.push_back(std::move(c));
  }
  if (copied.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(fs_->SyncDir(io::DirName(copied.front().shard_path())));
  proto::JobRecord job;
  job.set_job(to);
  job.set_world_size(copied.front().world_size());
  job.set_created_unix_micros(NowMicros());
  RETURN_IF_ERROR(catalog_->PutJob(job));
  for (const proto::ShardRecord& c : copied)
    RETURN_IF_ERROR(catalog_->PutShard(c));
  for (const proto::ShardRecord& c : copied) {
    RETURN_IF_ERROR(coordinator_
                        ->Vote(to, c.step(), c.rank(), c.world_size(),
                               {proto::TIER_LOCAL_DISK})
                        .status());
  }
  return absl::OkStatus();
}

absl::StatusOr<proto::RollbackRecord> CheckpointService::RollBack(
    const std::string& job, uint64_t step, const std::string& into,
    bool discard_newer) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  if (!into.empty()) RETURN_IF_ERROR(snapshot::ValidateJobId(into));
  if (into == job) {
    return absl::InvalidArgumentError(
        absl::StrCat("--into must name another job than ", job));
  }
  absl::MutexLock gc(&gc_mu_);  // no garbage collection meanwhile
  const std::string what =
      absl::StrCat("restoring job ", job, " to step ", step);
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards,
                   catalog_->ListShards(job));
  ASSIGN_OR_RETURN(const std::set<uint64_t> newer,
                   StepsAfterRollBackTarget(job, step, shards, what));
  proto::RollbackRecord record;
  record.set_to_step(step);
  record.set_unix_micros(NowMicros());
  for (proto::Tier tier : kAllTiers) {
    ASSIGN_OR_RETURN(absl::optional<uint64_t> latest,
                     coordinator_->LatestCommitted(job, tier));
    if (latest.has_value()) {
      record.set_from_step(std::max(record.from_step(), *latest));
    }
  }
  if (!into.empty()) {
    RETURN_IF_ERROR(ForkInto(job, step, shards, into, what, record));
    return record;
  }
  record.set_job(job);
  if (!discard_newer && !newer.empty()) {
    RETURN_IF_ERROR(ArchiveSteps(job, newer, shards, record));
  }
  record.set_dropped_steps(static_cast<uint32_t>(newer.size()));
  // The decision, atomically: newer steps uncommitted, latest back to `step`,
  // the record stored. Then their copies go (a crash in between leaves shards
  // no commit names: a new save of such a step replaces them).
  RETURN_IF_ERROR(coordinator_->RollBack(job, step, record));
  RETURN_IF_ERROR(DropStepsAfter(job, step, shards));
  failures_.Failed(job, "operator_rollback",
                   absl::StrCat("rolled back to step ", step, ", ",
                                newer.size(), " newer step(s) dropped"),
                   /*incident=*/true, absl::Now());
  CKPT_LOG_WARN("{}: {} newer step(s) {}", what, newer.size(),
                record.archived_as().empty()
                    ? std::string("discarded")
                    : "moved to job " + record.archived_as());
  return record;
}

absl::StatusOr<std::set<uint64_t>> CheckpointService::StepsAfterRollBackTarget(
    const std::string& job, uint64_t step,
    const std::vector<proto::ShardRecord>& shards, const std::string& what) {
  ASSIGN_OR_RETURN(absl::optional<proto::CommitRecord> commit,
                   coordinator_->GetCommit(job, step, proto::TIER_LOCAL_DISK));
  if (!commit.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        what, ": the step is not committed on disk (see ckpt ls ", job, ")"));
  }
  std::set<uint64_t> newer;
  uint32_t ranks_of_step = 0;
  for (const proto::ShardRecord& r : shards) {
    if (r.state() == proto::SHARD_STAGING || r.state() == proto::SHARD_STAGED) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": ", Describe(job, r.step(), r.rank()),
          " is still being saved or persisted; stop the job's trainers and "
          "wait for the persist"));
    }
    if (r.step() > step) newer.insert(r.step());
    if (r.step() == step && r.state() == proto::SHARD_PERSISTED) {
      ++ranks_of_step;
    }
  }
  if (ranks_of_step != commit->world_size()) {
    return absl::DataLossError(absl::StrCat(what, ": only ", ranks_of_step,
                                            " of its ", commit->world_size(),
                                            " shards are on disk"));
  }
  return newer;
}

absl::Status CheckpointService::ForkInto(
    const std::string& job, uint64_t step,
    const std::vector<proto::ShardRecord>& shards, const std::string& into,
    const std::string& what, proto::RollbackRecord& record) {
  ASSIGN_OR_RETURN(std::vector<proto::CommitRecord> existing,
                   coordinator_->ListCommits(into));
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> theirs,
                   catalog_->ListShards(into));
  if (!existing.empty()) {
    return absl::AlreadyExistsError(
        absl::StrCat(what, ": job ", into,
                     " already has committed steps; fork into a new job"));
  }
  for (const proto::ShardRecord& r : theirs) {
    RETURN_IF_ERROR(catalog_->DeleteShard(into, r.step(), r.rank()));
  }
  RETURN_IF_ERROR(CopySteps(job, shards, {step}, into));
  record.set_job(into);
  record.set_forked_from(job);
  record.set_from_step(0);
  RETURN_IF_ERROR(coordinator_->RollBack(into, step, record));
  CKPT_LOG_WARN("{}: forked into job {}", what, into);
  return absl::OkStatus();
}

absl::Status CheckpointService::ArchiveSteps(
    const std::string& job, const std::set<uint64_t>& newer,
    const std::vector<proto::ShardRecord>& shards,
    proto::RollbackRecord& record) {
  std::set<uint64_t> keep;
  for (uint64_t s : newer) {
    ASSIGN_OR_RETURN(auto c,
                     coordinator_->GetCommit(job, s, proto::TIER_LOCAL_DISK));
    if (c.has_value()) keep.insert(s);
  }
  const std::string archive =
      absl::StrCat(job, ".before-rollback-", record.unix_micros());
  RETURN_IF_ERROR(CopySteps(job, shards, keep, archive));
  record.set_archived_as(archive);
  return absl::OkStatus();
}

absl::Status CheckpointService::DropStepsAfter(
    const std::string& job, uint64_t step,
    const std::vector<proto::ShardRecord>& shards) {
  for (const proto::ShardRecord& r : shards) {
    if (r.step() <= step) continue;
    RETURN_IF_ERROR(catalog_->DeleteShard(job, r.step(), r.rank()));
    if (!r.slot_path().empty()) {
      (void)arena_->Release({job, r.step(), r.rank()});
    }
    if (!r.shard_path().empty()) (void)fs_->Unlink(r.shard_path());
  }
  bases_.Forget(job);  // the next saves do not build on dropped steps
  health_.RolledBackTo(job, step);  // the job's next save is not a restart
  changes_.Bump();
  return absl::OkStatus();
}

}  // namespace ckpt::daemon
