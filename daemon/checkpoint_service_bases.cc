// CheckpointService: incremental saves. Each rank's last persisted shard is
// the base of its next save, which stores only the chunks that changed and
// records where the others lie (snapshot/FORMAT.md, format 3). A base in use
// by a persist is pinned: garbage collection keeps its file, and keeps the
// files of every base a kept shard names (RetentionPolicy::pinned and
// ShardRecord.base_steps). Persists never wait for a collection: pinning
// and dropping records meet only under pin_mu_, briefly.
#include <vector>

#include "daemon/checkpoint_service.h"
#include "daemon/describe.h"
#include "io/logging.h"

namespace ckpt::daemon {

std::shared_ptr<const snapshot::ShardBase> CheckpointService::PinBase(
    const proto::ShardRecord& r) {
  // Only with the embedded coordinator (one node). With etcd, other nodes'
  // collections forget the commit records of steps they no longer hold, so a
  // base's step can look uncommitted and be saved again over its file after
  // a job restart (chaos.node_losses_close_together found a shard whose base
  // had been replaced). Until superseding a base first makes the shards on it
  // self-contained, many-node jobs save in full.
  if (options_.full_every <= 1 || options_.coordinator != nullptr)
    return nullptr;
  std::vector<std::shared_ptr<const snapshot::ShardBase>> candidates;
  {
    absl::MutexLock lock(&mu_);
    auto it = bases_.find({r.job(), r.rank()});
    if (it == bases_.end()) return nullptr;
    for (auto c = it->second.rbegin(); c != it->second.rend(); ++c)
      candidates.push_back(c->second);  // newest first
  }
  for (const std::shared_ptr<const snapshot::ShardBase>& base : candidates) {
    const proto::ShardManifest& m = base->manifest;
    if (m.step() >= r.step() || m.world_size() != r.world_size()) continue;
    // The rank's chain is as long as allowed: a full save, not a fallback
    // to an older base (which would keep that one, and rewrite what changed
    // since it, for ever).
    if (m.increments() + 1 >= static_cast<uint32_t>(options_.full_every)) break;
    // Only a step committed on disk: what withdraws uncommitted steps (a rank
    // resuming from an earlier one, a step saved again) never deletes a
    // base.
    absl::StatusOr<absl::optional<proto::CommitRecord>> commit =
        coordinator_->GetCommit(r.job(), m.step(), proto::TIER_LOCAL_DISK);
    if (!commit.ok() || !commit->has_value()) continue;
    // The record still names the file, checked and pinned under pin_mu_: a
    // collection either dropped the file before (the record says so) or
    // sees the pin when it drops records (ApplyDrops).
    absl::MutexLock pins(&pin_mu_);
    absl::StatusOr<absl::optional<proto::ShardRecord>> record =
        catalog_->GetShard(r.job(), m.step(), r.rank());
    if (!record.ok() || !record->has_value() ||
        (*record)->state() != proto::SHARD_PERSISTED ||
        (*record)->shard_path().empty()) {
      continue;  // dropped meanwhile
    }
    ++pinned_[{r.job(), r.rank(), m.step()}];
    return base;
  }
  CKPT_LOG_DEBUG(
      "{}: none of the rank's last {} shards is committed on disk and may be "
      "built on; this save stores every chunk",
      Describe(r.job(), r.step(), r.rank()), candidates.size());
  return nullptr;
}

void CheckpointService::UnpinBase(
    const proto::ShardRecord& r,
    const std::shared_ptr<const snapshot::ShardBase>& base) {
  if (base == nullptr) return;
  absl::MutexLock pins(&pin_mu_);
  auto it = pinned_.find({r.job(), r.rank(), base->manifest.step()});
  if (it != pinned_.end() && --it->second == 0) pinned_.erase(it);
}

void CheckpointService::RememberBase(const proto::ShardRecord& r,
                                     proto::ShardManifest manifest,
                                     uint64_t manifest_xxh3) {
  if (options_.full_every <= 1) return;
  auto base = std::make_shared<snapshot::ShardBase>();
  base->manifest = std::move(manifest);
  base->manifest_xxh3 = manifest_xxh3;
  absl::MutexLock lock(&mu_);
  auto& mine = bases_[{r.job(), r.rank()}];
  mine[r.step()] = std::move(base);
  while (mine.size() > kBaseCandidates) mine.erase(mine.begin());
}

void CheckpointService::ForgetBases(const std::string& job) {
  absl::MutexLock lock(&mu_);
  for (auto it = bases_.begin(); it != bases_.end();) {
    it = it->first.first == job ? bases_.erase(it) : std::next(it);
  }
}

std::set<std::pair<uint32_t, uint64_t>> CheckpointService::PinnedBases(
    const std::string& job) {
  std::set<std::pair<uint32_t, uint64_t>> pinned;
  absl::MutexLock pins(&pin_mu_);
  for (const auto& [key, n] : pinned_) {
    if (std::get<0>(key) == job)
      pinned.insert({std::get<1>(key), std::get<2>(key)});
  }
  return pinned;
}

bool CheckpointService::PinnedNow(const std::string& job, uint32_t rank,
                                  uint64_t step) {
  return pinned_.count({job, rank, step}) > 0;
}

}  // namespace ckpt::daemon
