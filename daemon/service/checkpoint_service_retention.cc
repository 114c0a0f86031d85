// CheckpointService: retention. Which committed steps each tier keeps (per job,
// --keep-disk / --keep-memory, and what peers and the shared tier hold), and
// ApplyDrops, the one place records and files are dropped from.
#include <algorithm>
#include <map>
#include <set>

#include "daemon/service/checkpoint_service.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {

void CheckpointService::CollectGarbage(const std::string& job) {
  absl::StatusOr<RetentionPlan> done = CollectGarbage(
      job, {options_.keep_disk_steps, options_.keep_memory_steps});
  if (!done.ok()) {
    CKPT_LOG_WARN("gc of job {}: {}", job, done.status().ToString());
  }
  if (replicator_ != nullptr) replicator_->CollectGarbage(job);
  if (parity_ != nullptr) {
    absl::StatusOr<absl::optional<Replicator::PeerRetention>> kept =
        replicator_->Retention(job);
    if (kept.ok() && kept->has_value()) {
      parity_->CollectGarbage(
          job, [&](uint64_t step) { return (*kept)->KeepsHeld(step); });
    }
  }
  if (shared_ != nullptr) {
    absl::StatusOr<std::vector<proto::CommitRecord>> commits =
        coordinator_->ListCommits(job);
    if (commits.ok()) shared_->CollectGarbage(job, *commits);
  }
}

absl::StatusOr<RetentionPlan> CheckpointService::CollectGarbage(
    const std::string& job, const RetentionPolicy& policy, bool dry_run) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  if (policy.keep_disk_steps < 1 || policy.keep_memory_steps < 1) {
    return absl::InvalidArgumentError(
        "retention must keep at least one step per tier");
  }
  // Shards persisted while this node was fenced look uncommitted until they
  // are voted again.
  RevoteIfRejoined();
  absl::MutexLock gc(&gc_mu_);
  ASSIGN_OR_RETURN(std::vector<proto::CommitRecord> commits,
                   coordinator_->ListCommits(job));
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards,
                   catalog_->ListShards(job));
  RetentionPolicy rules = policy;
  rules.peer_tier = replicator_ != nullptr;
  rules.pinned = bases_.Pinned(job);
  ASSIGN_OR_RETURN(absl::optional<uint64_t> resume,
                   coordinator_->ResumeStep(job));
  if (resume.has_value()) rules.resume_steps.insert(*resume);
  RetentionPlan plan = PlanRetention(commits, shards, rules);
  if (dry_run) return plan;
  // Steps the peer and shared tiers still keep: their shards are there, so
  // their commit records stay when this node drops its own copies. So do
  // those of the step the job's epoch resumes from.
  std::set<uint64_t> elsewhere = KeptElsewhere(commits);
  if (resume.has_value()) elsewhere.insert(*resume);
  // A step this plan forgets entirely loses its commit records first, so a
  // listed commit always has its shards (a crash in between leaves shards no
  // commit names, which the next collection drops). If that fails, its shards
  // stay.
  {
    std::map<uint64_t, size_t> held, forgotten;
    for (const proto::ShardRecord& r : shards) held[r.step()]++;
    for (const RetentionAction& a : plan.actions) {
      if (a.forget()) forgotten[a.shard.step()]++;
    }
    std::set<uint64_t> kept;
    for (const auto& [step, n] : forgotten) {
      if (n != held[step] || step >= plan.oldest_kept_disk_step ||
          elsewhere.count(step) > 0) {
        continue;
      }
      absl::Status s = coordinator_->ForgetStep(job, step);
      if (!s.ok()) {
        CKPT_LOG_WARN("gc of job {} step {}: {}; its shards stay", job, step,
                      s.ToString());
        kept.insert(step);
      }
    }
    if (!kept.empty()) {
      std::vector<RetentionAction> actions;
      for (RetentionAction& a : plan.actions) {
        if (a.forget() && kept.count(a.shard.step()) > 0) continue;
        actions.push_back(std::move(a));
      }
      plan.actions = std::move(actions);
    }
  }
  auto [applied, failed] = ApplyDrops(plan.actions);
  plan.actions.resize(applied);
  LogDecisions(job, plan, elsewhere);
  if (!failed.ok()) return failed;
  // A committed step older than the kept disk commits with no shard left
  // loses its commit records. Decided afresh each time from the catalog, so a
  // crash between forgetting the last shard and this leaves nothing behind.
  std::vector<proto::ShardRecord> left;
  if (applied > 0) {
    ASSIGN_OR_RETURN(left, catalog_->ListShards(job));
  } else {
    left = std::move(shards);
  }
  std::set<uint64_t> orphans;
  for (const proto::CommitRecord& c : commits) {
    if (c.step() < plan.oldest_kept_disk_step) orphans.insert(c.step());
  }
  for (const proto::ShardRecord& r : left) orphans.erase(r.step());
  for (uint64_t step : elsewhere) orphans.erase(step);
  for (uint64_t step : orphans) {
    absl::Status s = coordinator_->ForgetStep(job, step);
    if (!s.ok() && s.code() != absl::StatusCode::kFailedPrecondition) {
      CKPT_LOG_WARN("gc of job {} step {}: {}", job, step, s.ToString());
    }
  }
  return plan;
}

void CheckpointService::LogDecisions(const std::string& job,
                                     const RetentionPlan& plan,
                                     const std::set<uint64_t>& elsewhere) {
  if (plan.actions.empty()) return;
  std::set<uint64_t> slots, files, forgotten;
  for (const RetentionAction& a : plan.actions) {
    if (a.drop_slot) slots.insert(a.shard.step());
    if (a.drop_file) files.insert(a.shard.step());
    if (a.forget()) forgotten.insert(a.shard.step());
  }
  CKPT_LOG_INFO(
      "gc of job {}: memory copies of steps {} dropped, disk copies of steps "
      "{} dropped, shards of steps {} forgotten; disk keeps steps from {}, "
      "peers or the shared tier keep steps {}",
      job, StepList(slots), StepList(files), StepList(forgotten),
      plan.oldest_kept_disk_step, StepList(elsewhere));
}

std::pair<size_t, absl::Status> CheckpointService::ApplyDrops(
    std::vector<RetentionAction>& actions) {
  // Slots go back to the arena at once, where the next save is waiting for
  // one; files are unlinked after the loop (a large one takes a while).
  // The catalog is rewritten in batches, one sync each (a sync per shard
  // made a collection of thousands of shards take seconds while saves
  // waited for memory).
  constexpr size_t kBatch = 256;
  std::vector<std::string> unlink;
  absl::Status failed;
  size_t applied = 0;
  while (applied < actions.size()) {
    const size_t end = std::min(actions.size(), applied + kBatch);
    std::vector<proto::ShardRecord> put, forget;
    // A file pinned as the base of a persist since the plan was made stays:
    // the check and the records' update are atomic against PinBase.
    IncrementalBases::Freeze pins(bases_);
    for (size_t i = applied; i < end; ++i) {
      RetentionAction& a = actions[i];
      if (a.drop_file &&
          pins.Pinned(a.shard.job(), a.shard.rank(), a.shard.step())) {
        a.drop_file = false;
      }
      proto::ShardRecord r = a.shard;
      if (a.drop_file) r.clear_shard_path();
      if (a.drop_slot) r.clear_slot_path();
      if (!a.drop_file && !a.drop_slot) continue;
      (a.forget() ? forget : put).push_back(std::move(r));
    }
    // The catalog forgets first: a crash in between leaves unreferenced
    // files, which the next start deletes; never a reference to a deleted
    // file.
    failed = catalog_->UpdateShards(put, forget);
    if (!failed.ok()) break;
    CKPT_KILL_POINT("service.gc_after_catalog");
    for (size_t i = applied; i < end; ++i) {
      const RetentionAction& a = actions[i];
      if (a.drop_slot) {
        (void)arena_->Release({a.shard.job(), a.shard.step(), a.shard.rank()});
      }
      if (a.drop_file) unlink.push_back(a.shard.shard_path());
    }
    applied = end;
  }
  for (const std::string& file : unlink) recycler_->Retire(file);
  return {applied, failed};
}

}  // namespace ckpt::daemon
