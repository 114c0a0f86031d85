#include "daemon/persist/retention.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

std::string StepList(const std::set<uint64_t>& steps) {
  std::string out;
  for (auto it = steps.begin(); it != steps.end();) {
    const uint64_t first = *it;
    uint64_t last = first;
    for (++it; it != steps.end() && *it == last + 1; ++it) last = *it;
    absl::StrAppend(&out, out.empty() ? "" : ",", first);
    if (last != first) absl::StrAppend(&out, "-", last);
  }
  return out.empty() ? "none" : out;
}

proto::DroppedCopy ToProto(const RetentionAction& a) {
  proto::DroppedCopy d;
  d.set_step(a.shard.step());
  d.set_rank(a.shard.rank());
  if (a.drop_file) d.set_shard_path(a.shard.shard_path());
  if (a.drop_slot) d.set_slot_path(a.shard.slot_path());
  d.set_forgotten(a.forget());
  return d;
}

RetentionPlan PlanRetention(const std::vector<proto::CommitRecord>& commits,
                            const std::vector<proto::ShardRecord>& shards,
                            const RetentionPolicy& policy) {
  // Steps committed per tier, newest first; a tier keeps its newest `keep`.
  auto kept = [&](proto::Tier tier, int keep) {
    std::vector<uint64_t> steps;
    for (const auto& c : commits) {
      if (c.tier() == tier) steps.push_back(c.step());
    }
    std::sort(steps.rbegin(), steps.rend());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    if (steps.size() > static_cast<size_t>(std::max(keep, 1)))
      steps.resize(std::max(keep, 1));
    return steps;
  };
  const std::vector<uint64_t> disk =
      kept(proto::TIER_LOCAL_DISK, policy.keep_disk_steps);
  const std::vector<uint64_t> memory =
      kept(proto::TIER_MEMORY, policy.keep_memory_steps);
  RetentionPlan plan;
  if (disk.empty()) return plan;  // nothing is safe on disk yet
  plan.oldest_kept_disk_step = disk.back();
  const uint64_t newest =
      memory.empty() ? disk.front() : std::max(disk.front(), memory.front());
  // The newest step held by K peers is what a node loss falls back to: its
  // files stay here too, so that losing a peer does not lose the step.
  const std::vector<uint64_t> peer = kept(proto::TIER_PEER, 1);
  // And a newer step may still be committed there: its files stay until it
  // is, or a newer one is (a step older than the newest peer commit is never
  // the one a node loss falls back to).
  auto peer_holds = [&](uint64_t step) {
    if (!peer.empty() && step == peer.front()) return true;
    return policy.peer_tier && (peer.empty() || step > peer.front());
  };
  for (const proto::ShardRecord& r : shards) {
    // (A staged copy whose persist was skipped goes like a persisted one.)
    if (r.state() == proto::SHARD_STAGING ||
        (r.state() == proto::SHARD_STAGED && !r.persist_skipped()))
      continue;
    const uint64_t step = r.step();
    if (policy.resume_steps.count(step) > 0) continue;
    RetentionAction a;
    a.drop_file = !r.shard_path().empty() &&
                  step < plan.oldest_kept_disk_step && !peer_holds(step);
    a.drop_slot = !r.slot_path().empty() && step <= newest &&
                  std::find(memory.begin(), memory.end(), step) == memory.end();
    if (!a.drop_file && !a.drop_slot) continue;
    a.shard = r;
    plan.actions.push_back(std::move(a));
  }
  // Files that kept files (or persists in flight) store chunks in stay; a
  // file kept that way keeps the files it stores chunks in in turn.
  std::set<std::pair<uint32_t, uint64_t>> dropped;
  for (const RetentionAction& a : plan.actions) {
    if (a.drop_file) dropped.insert({a.shard.rank(), a.shard.step()});
  }
  for (bool changed = true; changed;) {
    changed = false;
    std::set<std::pair<uint32_t, uint64_t>> referenced = policy.pinned;
    for (const proto::ShardRecord& r : shards) {
      if (r.shard_path().empty() || dropped.count({r.rank(), r.step()}) > 0)
        continue;
      for (uint64_t base : r.base_steps()) referenced.insert({r.rank(), base});
    }
    for (const auto& key : referenced) changed |= dropped.erase(key) > 0;
  }
  std::vector<RetentionAction> actions;
  for (RetentionAction& a : plan.actions) {
    if (a.drop_file && dropped.count({a.shard.rank(), a.shard.step()}) == 0)
      a.drop_file = false;
    if (a.drop_file || a.drop_slot) actions.push_back(std::move(a));
  }
  plan.actions = std::move(actions);
  return plan;
}

}  // namespace ckpt::daemon
