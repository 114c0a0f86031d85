#include "daemon/health/replica_audit.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/health/replica_check.h"
#include "io/logging.h"

namespace ckpt::daemon {

ReplicaAudit::ReplicaAudit(Coordinator* coordinator, Metrics* metrics,
                           std::string node, VerdictCallback on_verdict)
    : coordinator_(coordinator),
      metrics_(metrics),
      node_(std::move(node)),
      on_verdict_(std::move(on_verdict)) {
  using T = Metrics::Type;
  metrics_->Declare("ckpt_replica_checks_total", T::kCounter,
                    "committed steps whose replicated boxes this node "
                    "compared, by verdict: clean, suspect");
  metrics_->Declare("ckpt_sdc_suspect_steps_total", T::kCounter,
                    "steps whose replicas disagree (silent data corruption "
                    "suspected): not resumed from unless asked for");
  metrics_->Declare("ckpt_sdc_suspect_shards_total", T::kCounter,
                    "shards outside their replicas' majority (or, with no "
                    "majority, every replica), by node and rank");
}

bool ReplicaAudit::PostStaged(const proto::ShardRecord& shard) {
  absl::optional<proto::ReplicaDigests> digests = DigestsOfStaged(shard, node_);
  if (!digests.has_value()) return false;
  Post(shard.job(), shard.step(), *digests);
  return true;
}

void ReplicaAudit::PostPersisted(const proto::ShardRecord& shard,
                                 const proto::ShardManifest& manifest) {
  if (DigestsOfStaged(shard, node_).has_value()) return;
  std::set<std::string> rank_local;
  for (const proto::StagedItem& s : shard.items()) {
    if (s.rank_local()) rank_local.insert(s.item().name());
  }
  proto::ReplicaDigests digests =
      DigestsOfManifest(manifest, node_, rank_local);
  digests.set_staged_unix_micros(shard.staged_unix_micros());
  Post(manifest.job(), manifest.step(), digests);
}

void ReplicaAudit::Post(const std::string& job, uint64_t step,
                        const proto::ReplicaDigests& digests) {
  absl::Status s = coordinator_->PutReplicaDigests(job, step, digests);
  if (!s.ok()) {
    CKPT_LOG_WARN(
        "job {} step {} rank {}: its digests were not posted, the "
        "step's replicas go unchecked: {}",
        job, step, digests.rank(), s.ToString());
  }
}

void ReplicaAudit::StepCommitted(const std::string& job, uint64_t step) {
  {
    absl::MutexLock lock(&mu_);
    if (settled_.count({job, step}) != 0) return;
  }
  auto settled = [&] {
    absl::MutexLock lock(&mu_);
    settled_.insert({job, step});
    if (settled_.size() > kSettledKept) settled_.erase(settled_.begin());
  };
  absl::StatusOr<absl::optional<proto::ReplicaCheck>> kept =
      coordinator_->GetReplicaCheck(job, step);
  if (kept.ok() && kept->has_value()) {
    settled();
    if (on_verdict_) on_verdict_(**kept, false);
    return;
  }
  absl::StatusOr<std::vector<proto::ReplicaDigests>> digests =
      coordinator_->ListReplicaDigests(job, step);
  if (!kept.ok() || !digests.ok()) {
    CKPT_LOG_WARN("job {} step {}: its replicas were not compared: {}", job,
                  step,
                  (kept.ok() ? digests.status() : kept.status()).ToString());
    return;
  }
  // Every rank's digests, or a later commit of the step tries again (a
  // persist posts them before its vote).
  if (digests->empty() || digests->size() < digests->front().world_size()) {
    return;
  }
  proto::ReplicaCheck check = CompareReplicas(job, step, *digests);
  check.set_checked_by(node_);
  check.set_checked_unix_micros(absl::ToUnixMicros(absl::Now()));
  absl::StatusOr<proto::ReplicaCheck> verdict =
      coordinator_->SettleReplicaCheck(check);
  if (!verdict.ok()) {
    CKPT_LOG_WARN("job {} step {}: keeping its replica check failed: {}", job,
                  step, verdict.status().ToString());
    return;
  }
  settled();
  const bool kept_here =
      verdict->checked_by() == node_ &&
      verdict->checked_unix_micros() == check.checked_unix_micros();
  if (kept_here) Report(*verdict);
  if (on_verdict_) on_verdict_(*verdict, kept_here);
}

void ReplicaAudit::Report(const proto::ReplicaCheck& check) {
  const Labels job = {{"job", check.job()}};
  metrics_->Add("ckpt_replica_checks_total",
                {{"job", check.job()},
                 {"verdict", check.suspect() ? "suspect" : "clean"}});
  if (!check.suspect()) return;
  metrics_->Add("ckpt_sdc_suspect_steps_total", job);
  // Each shard once, however many of its boxes disagree.
  std::set<std::pair<uint32_t, std::string>> shards;
  for (const proto::ReplicaMismatch& m : check.mismatches()) {
    for (int i = 0; i < m.minority_ranks_size(); ++i)
      shards.insert({m.minority_ranks(i), m.minority_nodes(i)});
  }
  for (const auto& [rank, node] : shards) {
    metrics_->Add(
        "ckpt_sdc_suspect_shards_total",
        {{"job", check.job()}, {"node", node}, {"rank", absl::StrCat(rank)}});
  }
  CKPT_LOG_ERROR(
      "job {} step {}: silent data corruption suspected, its replicas "
      "disagree ({} of {} replicated boxes): {}. The step is not resumed "
      "from unless asked for",
      check.job(), check.step(), check.mismatches_size(),
      check.replicated_boxes(), DescribeMismatches(check));
}

}  // namespace ckpt::daemon
