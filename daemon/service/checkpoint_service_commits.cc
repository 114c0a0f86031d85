// CheckpointService: voting and commit. Commits noted as votes complete them,
// trainers' restores and the shards they withdraw, save health, and the
// queries on commits and shards (WaitCommitted, LatestCommitted, ListCommits,
// GetShard).

#include <algorithm>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/describe.h"
#include "daemon/common/records.h"
#include "daemon/service/checkpoint_service.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/manifest_seal.h"
#include "snapshot/names.h"
#include "snapshot/shard_reader.h"

namespace ckpt::daemon {

void CheckpointService::Committed(const std::string& job, uint64_t step,
                                  const std::vector<proto::Tier>& tiers) {
  health_.Committed(job, step, tiers, absl::Now());
  if (!tiers.empty()) audit_->StepCommitted(job, step);
  changes_.Bump();
}

absl::Status CheckpointService::ReportRestore(
    const proto::ReportRestoreRequest& report) {
  const std::string& job = report.shard().job();
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  for (const auto& [source, bytes] :
       {std::make_pair(TierName(proto::TIER_MEMORY), report.memory_bytes()),
        std::make_pair(TierName(proto::TIER_LOCAL_DISK),
                       report.local_disk_bytes()),
        std::make_pair(std::string("peer_stream"), report.peer_bytes())}) {
    if (bytes == 0) continue;
    const Labels labels = {{"job", job}, {"source", source}};
    metrics_.Add("ckpt_restores_total", labels);
    metrics_.Add("ckpt_restored_bytes_total", labels,
                 static_cast<double>(bytes));
  }
  metrics_.Add("ckpt_checksum_mismatches_total", {{"job", job}},
               report.checksum_mismatches());
  metrics_.Add("ckpt_restore_fallbacks_total", {{"job", job}},
               report.fallbacks());
  if (!report.resume()) return absl::OkStatus();
  goodput_.Resumed(job, report.shard().step(), absl::Now());
  return WithdrawNewer(job, report.shard().rank(), report.shard().step());
}

absl::Status CheckpointService::WithdrawNewer(const std::string& job,
                                              uint32_t rank, uint64_t step) {
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards,
                   catalog_->ListShards(job));
  std::set<uint64_t> withdrawn_here;
  // Newest first: a shard built on an older one goes before its base, which
  // then has nothing to detach (DetachDependents).
  std::sort(shards.begin(), shards.end(),
            [](const proto::ShardRecord& a, const proto::ShardRecord& b) {
              return a.step() > b.step();
            });
  for (const proto::ShardRecord& shard : shards) {
    if (shard.rank() != rank || shard.step() <= step) continue;
    withdrawn_here.insert(shard.step());
    const std::string what = Describe(job, shard.step(), rank);
    absl::Status withdrawn = shard.state() == proto::SHARD_STAGING
                                 ? AbortStage(job, shard.step(), rank)
                                 : Supersede(shard);
    if (withdrawn.ok()) {
      CKPT_LOG_INFO("{}: withdrawn, rank {} resumed from step {}", what, rank,
                    step);
      metrics_.Add("ckpt_shards_withdrawn_total", {{"job", job}});
    } else if (withdrawn.code() == absl::StatusCode::kFailedPrecondition ||
               withdrawn.code() == absl::StatusCode::kAlreadyExists) {
      // Committed (or gone) meanwhile: a committed step is never taken back;
      // the trainer restored an older step on purpose.
      CKPT_LOG_INFO("{}: kept although rank {} resumed from step {}: {}", what,
                    rank, step, std::string(withdrawn.message()));
    } else {
      return absl::Status(withdrawn.code(),
                          absl::StrCat("withdrawing ", what, " (rank ", rank,
                                       " resumed from step ", step,
                                       "): ", withdrawn.message()));
    }
  }
  // Votes no catalog here knows of: cast for copies that are gone (a node
  // that lost its memory and disks, or the rank's former node). Left, they
  // would count for the rank when the other ranks save those steps again,
  // and commit a step whose shard of this rank does not exist.
  ASSIGN_OR_RETURN(std::set<uint64_t> voted,
                   coordinator_->StepsVotedBy(job, rank, step));
  for (uint64_t newer : voted) {
    if (withdrawn_here.count(newer) > 0) continue;
    const std::string what = Describe(job, newer, rank);
    absl::Status withdrawn = coordinator_->WithdrawVote(job, newer, rank);
    if (withdrawn.ok()) {
      CKPT_LOG_INFO(
          "{}: its vote, cast for a copy this node does not have, withdrawn: "
          "rank {} resumed from step {}",
          what, rank, step);
      metrics_.Add("ckpt_shards_withdrawn_total", {{"job", job}});
    } else if (withdrawn.code() != absl::StatusCode::kAlreadyExists) {
      return absl::Status(withdrawn.code(),
                          absl::StrCat("withdrawing the vote of ", what,
                                       " (rank ", rank, " resumed from step ",
                                       step, "): ", withdrawn.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<proto::CommitRecord> CheckpointService::WaitCommitted(
    const std::string& job, uint64_t step, proto::Tier tier,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  hangs_.WaitBegun(job, step);  // its rank waits for peers, it does not hang
  absl::Cleanup waited = [&] { hangs_.WaitEnded(job, step, absl::Now()); };
  while (true) {
    // A waiter must not depend on other saves to get the votes refused while
    // this node was fenced made again.
    RevoteIfRejoined();
    const uint64_t seen = changes_.Current();
    ASSIGN_OR_RETURN(absl::optional<proto::CommitRecord> commit,
                     coordinator_->GetCommit(job, step, tier));
    if (commit.has_value()) return *commit;
    ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards,
                     catalog_->ListShards(job));
    bool kept = false;
    for (const proto::ShardRecord& r : shards) {
      if (r.step() != step) continue;
      kept = true;
      if (r.state() == proto::SHARD_FAILED && tier == proto::TIER_LOCAL_DISK) {
        return absl::Status(absl::StatusCode::kAborted,
                            absl::StrCat(Describe(job, step, r.rank()),
                                         " failed to persist: ", r.error()));
      }
      // The disk and the tiers made from its files never get it.
      if (r.persist_skipped() && tier != proto::TIER_MEMORY) {
        return absl::FailedPreconditionError(absl::StrCat(
            Describe(job, step, r.rank()), " will not reach tier ",
            TierName(tier),
            ": a newer save of its rank came before the disk took it "
            "(ckptd --persist-newest persists each rank's newest waiting "
            "save only)"));
      }
    }
    if (!kept) RETURN_IF_ERROR(NotWaitedFor(job, step, tier));
    // Another node's vote may commit the step (etcd): look again every
    // 100 ms even when nothing changed here.
    const absl::Time look_again =
        std::min(deadline, absl::Now() + absl::Milliseconds(100));
    if (!changes_.AwaitChange(seen, look_again) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job ", job, " step ", step, " is not committed at tier ",
          TierName(tier), " after ", absl::FormatDuration(timeout)));
    }
  }
}

absl::Status CheckpointService::NotWaitedFor(const std::string& job,
                                             uint64_t step, proto::Tier tier) {
  ASSIGN_OR_RETURN(absl::optional<uint64_t> latest,
                   coordinator_->LatestCommitted(job, tier));
  if (!latest.has_value() || *latest <= step) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      "job ", job, " step ", step, " has no commit at tier ", TierName(tier),
      " and nothing of it is kept on this node, while step ", *latest,
      " is committed there: retention dropped it after the newer step ",
      "committed (see --keep-disk, --keep-memory), or it never completed"));
}

absl::StatusOr<absl::optional<uint64_t>> CheckpointService::LatestCommitted(
    const std::string& job, proto::Tier tier, bool include_suspect) {
  return include_suspect ? coordinator_->LatestCommitted(job, tier)
                         : coordinator_->LatestTrusted(job, tier);
}

absl::StatusOr<std::vector<proto::ReplicaCheck>>
CheckpointService::SuspectSteps(
    const std::string& job, const std::vector<proto::CommitRecord>& commits) {
  std::set<uint64_t> steps;
  for (const proto::CommitRecord& c : commits) steps.insert(c.step());
  std::vector<proto::ReplicaCheck> out;
  for (uint64_t step : steps) {
    ASSIGN_OR_RETURN(absl::optional<proto::ReplicaCheck> check,
                     coordinator_->GetReplicaCheck(job, step));
    if (check.has_value() && check->suspect()) out.push_back(*check);
  }
  return out;
}

absl::StatusOr<std::vector<proto::CommitRecord>> CheckpointService::ListCommits(
    const std::string& job) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  ASSIGN_OR_RETURN(std::vector<proto::CommitRecord> commits,
                   coordinator_->ListCommits(job));
  const bool shared_known = std::any_of(commits.begin(), commits.end(),
                                        [](const proto::CommitRecord& c) {
                                          return c.tier() == proto::TIER_SHARED;
                                        });
  if (shared_ != nullptr && !shared_known) {
    // A cluster that never saw the job (a new one, its coordinator empty):
    // what the shared tier's markers say is committed there.
    AddMarkers(job, absl::nullopt, &commits);
  }
  return commits;
}

void CheckpointService::AddMarkers(const std::string& job,
                                   absl::optional<uint64_t> step,
                                   std::vector<proto::CommitRecord>* commits) {
  // A tier that cannot be read (down, credentials refused) adds nothing: the
  // other tiers' commits still answer.
  absl::StatusOr<std::vector<proto::CommitRecord>> marked =
      shared_->Markers(job, step);
  if (!marked.ok()) {
    CKPT_LOG_WARN("job {}: the shared tier's commit markers: {}", job,
                  marked.status().ToString());
    return;
  }
  commits->insert(commits->end(), marked->begin(), marked->end());
}

absl::StatusOr<std::vector<proto::CommitRecord>>
CheckpointService::ListStepCommits(const std::string& job, uint64_t step) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  std::vector<proto::CommitRecord> out;
  for (proto::Tier tier : kAllTiers) {
    ASSIGN_OR_RETURN(absl::optional<proto::CommitRecord> c,
                     coordinator_->GetCommit(job, step, tier));
    if (c.has_value()) out.push_back(*std::move(c));
  }
  const bool shared_known =
      std::any_of(out.begin(), out.end(), [](const proto::CommitRecord& c) {
        return c.tier() == proto::TIER_SHARED;
      });
  if (shared_ != nullptr && !shared_known) {
    AddMarkers(job, step, &out);
  }
  return out;
}

absl::Status CheckpointService::SealedForRestore(proto::ShardRecord& r) const {
  // Only a cluster key makes a seal to check. The file is checked even when
  // a slot is there: a restore that finds the slot unusable reads the file.
  if (snapshot::InstalledSealKeys() == nullptr || r.shard_path().empty()) {
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> reader =
      snapshot::ShardReader::Open(fs_, r.shard_path());
  if (reader.ok()) return absl::OkStatus();
  const absl::Status refused(
      reader.status().code(),
      absl::StrCat("shard file ", r.shard_path(),
                   " is refused: ", reader.status().message()));
  // The slot alone (memory only this uid maps) still serves the restore.
  absl::StatusOr<bool> slot = r.slot_path().empty()
                                  ? absl::StatusOr<bool>(false)
                                  : fs_->Exists(r.slot_path());
  if (slot.ok() && *slot) {
    CKPT_LOG_ERROR("{}; the restore reads the staged slot only",
                   refused.ToString());
    r.clear_shard_path();
    return absl::OkStatus();
  }
  return refused;
}

absl::StatusOr<proto::ShardRecord> CheckpointService::GetShard(
    const std::string& job, uint64_t step, uint32_t rank, bool on_demand) {
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> r,
                   catalog_->GetShard(job, step, rank));
  // Whole here: staged (its slot), persisted (its file), or failed to persist
  // with its slot left.
  const bool whole =
      r.has_value() &&
      (r->state() == proto::SHARD_STAGED ||
       r->state() == proto::SHARD_PERSISTED ||
       (r->state() == proto::SHARD_FAILED && !r->slot_path().empty()));
  // A shard being staged here is a new save of the step (one not yet
  // committed when it began): a committed copy of the step, if peers or the
  // shared tier hold one, is what a restore wants; else the caller learns
  // that it is being staged.
  absl::Status refused;
  if (whole) {
    refused = SealedForRestore(*r);
    if (refused.ok()) return *r;
    CKPT_LOG_ERROR("{}: {}; looking for another copy",
                   Describe(job, step, rank), refused.ToString());
  }
  absl::Status elsewhere = absl::NotFoundError(
      absl::StrCat("no shard for ", Describe(job, step, rank)));
  if (replicator_ != nullptr) {
    absl::StatusOr<proto::ShardRecord> fetched =
        replicator_->Fetch(job, step, rank);
    if (fetched.ok()) return fetched;
    elsewhere = fetched.status();
  }
  if (shared_ != nullptr) {
    absl::StatusOr<proto::ShardRecord> copy =
        shared_->Find(job, step, rank, on_demand);
    if (copy.ok()) return copy;
    elsewhere = absl::Status(
        elsewhere.code(),
        absl::StrCat(elsewhere.message(), "; ", copy.status().message()));
  }
  if (!refused.ok()) {
    return absl::Status(refused.code(),
                        absl::StrCat(refused.message(),
                                     "; no other copy: ", elsewhere.message()));
  }
  if (!r.has_value()) return elsewhere;
  if (replicator_ != nullptr || shared_ != nullptr) {
    CKPT_LOG_WARN("{}: no copy elsewhere either: {}", Describe(job, step, rank),
                  elsewhere.ToString());
  }
  if (!r.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("no shard for ", Describe(job, step, rank)));
  }
  return *r;
}

absl::Status CheckpointService::LandRange(
    const proto::LandRangeRequest& request) {
  const proto::ShardKey& key = request.shard();
  RETURN_IF_ERROR(snapshot::ValidateJobId(key.job()));
  if (shared_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no shared tier here: nothing of ",
                     Describe(key.job(), key.step(), key.rank()), " lands"));
  }
  return shared_->LandRange(request.shard_path(), key.job(), key.step(),
                            key.rank(), request.offset(), request.length());
}

}  // namespace ckpt::daemon
