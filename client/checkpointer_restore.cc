#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/checkpointer_internal.h"
#include "client/resharder.h"
#include "client/save_stager.h"
#include "client/shard_restorer.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/daemon.grpc.pb.h"

namespace ckpt::client {

namespace {

// The replicas of a suspect step that are outside their box's majority
// (none when the step is not suspect): the restore reads the majority's.
ReplicasAvoided AvoidedReplicas(const proto::ListCommitsResponse& commits,
                                uint64_t step, const std::string& what) {
  ReplicasAvoided avoided;
  for (const proto::ReplicaCheck& check : commits.suspects()) {
    if (check.step() != step) continue;
    for (const proto::ReplicaMismatch& m : check.mismatches()) {
      if (m.majority_ranks().empty()) {
        CKPT_LOG_WARN(
            "{}: the step is suspect, the replicas of \"{}\" "
            "disagree with no majority; each rank's own are restored",
            what, m.item());
        continue;
      }
      for (uint32_t rank : m.minority_ranks()) avoided.insert({m.item(), rank});
    }
  }
  if (!avoided.empty()) {
    CKPT_LOG_WARN(
        "{}: the step is suspect (its replicas disagree); the "
        "majority's bytes are restored, {} replica(s) avoided",
        what, avoided.size());
  }
  return avoided;
}

}  // namespace

absl::Status Checkpointer::Restore(uint64_t step) {
  report_ = RestoreReport();
  absl::Status restored = RestoreFrom(step);
  if (restored.ok()) {
    // The figures are for the metrics; for a trainer (not read_only) the
    // report also withdraws its shards of newer uncommitted steps, which must
    // succeed before it saves again.
    proto::ReportRestoreRequest req;
    req.mutable_shard()->set_job(options_.job);
    req.mutable_shard()->set_step(step);
    req.mutable_shard()->set_rank(options_.rank);
    req.set_memory_bytes(report_.memory_bytes);
    req.set_local_disk_bytes(report_.disk_bytes);
    req.set_peer_bytes(report_.peer_bytes);
    req.set_checksum_mismatches(report_.mismatches);
    req.set_fallbacks(report_.fallbacks);
    req.set_resume(!options_.read_only);
    proto::ReportRestoreResponse ignored;
    // Resuming withdraws the rank's newer uncommitted shards one by one: a
    // job that ran far past its last commit has hundreds (chaos seed
    // 3734966263: 160 steps took longer than the usual deadline on a loaded
    // machine).
    absl::Status reported =
        rpc_->Call(&proto::CkptDaemon::Stub::ReportRestore, req, &ignored,
                   absl::StrCat("resuming from step ", step),
                   req.resume() ? absl::Minutes(5) : absl::ZeroDuration());
    if (req.resume()) return reported;
  }
  return restored;
}

absl::StatusOr<absl::optional<uint64_t>> Checkpointer::RestoreLatest(
    proto::Tier tier) {
  constexpr int kAttempts = 5;
  absl::Status failed;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    ASSIGN_OR_RETURN(absl::optional<uint64_t> latest, LatestCommitted(tier));
    if (!latest.has_value()) return latest;
    failed = Restore(*latest);
    if (failed.ok()) return latest;
    ASSIGN_OR_RETURN(absl::optional<uint64_t> now, LatestCommitted(tier));
    if (!now.has_value() || *now == *latest) return failed;
  }
  return failed;
}

absl::Status Checkpointer::RestoreFrom(uint64_t step) {
  saves_->Drain();
  const std::string what = absl::StrCat(
      "restoring job ", options_.job, " step ", step, " rank ", options_.rank);
  // Only a committed step is restored: a step some rank never saved would mix
  // states of different steps.
  proto::ListCommitsRequest list;
  list.set_job(options_.job);
  list.set_step(step);
  proto::ListCommitsResponse commits;
  RETURN_IF_ERROR(
      rpc_->Call(&proto::CkptDaemon::Stub::ListCommits, list, &commits, what));
  auto commit = std::find_if(
      commits.commits().begin(), commits.commits().end(),
      [step](const proto::CommitRecord& c) { return c.step() == step; });
  if (commit == commits.commits().end()) {
    return absl::NotFoundError(
        absl::StrCat(what, ": step ", step, " is not committed at any tier"));
  }
  const ReplicasAvoided avoided = AvoidedReplicas(commits, step, what);
  const absl::Time deadline = absl::Now() + options_.restore_peer_wait;
  absl::Duration pause = absl::Milliseconds(200);
  for (;;) {
    absl::Status restored = RestoreOnce(step, *commit, avoided, what);
    if (!absl::IsUnavailable(restored) || absl::Now() + pause > deadline) {
      return restored;
    }
    CKPT_LOG_WARN("{}; asking again in {} (waiting up to {} in all)",
                  restored.ToString(), absl::FormatDuration(pause),
                  absl::FormatDuration(options_.restore_peer_wait));
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Seconds(2));
  }
}

absl::Status Checkpointer::RestoreOnce(uint64_t step,
                                       const proto::CommitRecord& commit,
                                       const ReplicasAvoided& avoided,
                                       const std::string& what) {
  if (commit.world_size() != options_.world_size || !avoided.empty()) {
    return Resharder(Restoring(), what, avoided)
        .Restore(step, commit.world_size());
  }
  if (device_->host_resident()) {
    // A shard on no local tier streams straight from a peer into place.
    absl::Status streamed =
        ShardRestorer(Restoring(), what).FromPeerStream(step);
    if (streamed.ok()) return streamed;
    if (!absl::IsFailedPrecondition(streamed) && !absl::IsNotFound(streamed)) {
      CKPT_LOG_WARN("{}: streaming from a peer failed ({}); ckptd fetches it",
                    what, streamed.ToString());
      if (absl::IsDataLoss(streamed)) ++report_.mismatches;
      ++report_.fallbacks;
    }
  }
  // The copies ckptd names may go before they are read (retention dropped
  // them meanwhile: a newer step committed, or the step is kept elsewhere);
  // ckptd is then asked again, and names what is left (peers, shared tier).
  constexpr int kAttempts = 3;
  absl::Status restored;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    bool vanished = false;
    restored = ShardRestorer(Restoring(), what)
                   .Restore(step, commit.world_size(), &vanished);
    if (restored.ok() || !vanished) break;
    CKPT_LOG_WARN("{} ({}); asking ckptd again", restored.ToString(),
                  "its copies on this node were dropped while it was read");
    ++report_.fallbacks;
  }
  return restored;
}

RestoreContext Checkpointer::Restoring() {
  return {options_, *rpc_, *device_, items_, report_};
}

}  // namespace ckpt::client
