// CheckpointService: the peer tier seen from this node. Nodes lost (their
// replicas are made again elsewhere), a fenced daemon that rejoined (its votes
// are cast again), replicas verified by peers (voted at TIER_PEER), and the
// shard offers and lookups peers and restores ask for.
#include <algorithm>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/common/describe.h"
#include "daemon/service/checkpoint_service.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {

void CheckpointService::PeersLost(const std::vector<std::string>& lost) {
  // Every group's lost data shards are rebuilt on stand-ins.
  if (parity_ != nullptr) parity_->RepairLostData();
  absl::StatusOr<std::vector<proto::ShardRecord>> shards =
      catalog_->ListShards();
  if (!shards.ok()) {
    CKPT_LOG_WARN("peers {} left; listing shards: {}",
                  absl::StrJoin(lost, ", "), shards.status().ToString());
    return;
  }
  for (const proto::ShardRecord& r : *shards) {
    if (r.state() != proto::SHARD_PERSISTED || r.shard_path().empty()) {
      continue;
    }
    if (parity_ != nullptr && r.parity_protected()) {
      // Its group's parity is checked, and made again where nodes holding
      // it were lost (retention keeps few steps: few shards to check).
      parity_->Enqueue(r, /*again=*/true);
      continue;
    }
    std::vector<std::string> holders;
    for (const std::string& n : r.replica_nodes()) {
      if (std::find(lost.begin(), lost.end(), n) == lost.end()) {
        holders.push_back(n);
      }
    }
    if (holders.size() == static_cast<size_t>(r.replica_nodes_size())) {
      continue;  // none of its replicas was there
    }
    CKPT_LOG_INFO(
        "{}: a node holding its replica left or restarted; replicating again",
        Describe(r.job(), r.step(), r.rank()));
    replicator_->Enqueue(r, holders);
  }
}

void CheckpointService::PeerReached(const std::string& job,
                                    const std::string& node,
                                    const absl::Status& status) {
  if (status.ok()) {
    failures_.Healed(job, "peer_unreachable", absl::Now(), node);
    return;
  }
  failures_.FailedEpisode(
      job, "peer_unreachable",
      absl::StrCat("node ", node,
                   " could not be reached for a replica: ", status.message()),
      absl::Now(), node);
}

void CheckpointService::RevoteIfRejoined() {
  // Held for the whole re-vote: a caller returns only once the votes refused
  // while fenced are made again (garbage collection must not take a shard
  // whose vote is still under way for an abandoned one).
  absl::MutexLock revoting(&revote_mu_);
  const int rejoins = coordinator_->Rejoins();
  if (rejoins == rejoins_seen_) return;
  rejoins_seen_ = rejoins;
  absl::StatusOr<std::vector<proto::ShardRecord>> shards =
      catalog_->ListShards();
  if (!shards.ok()) {
    CKPT_LOG_WARN("re-voting after rejoining: {}", shards.status().ToString());
    return;
  }
  int revoted = 0;
  for (const proto::ShardRecord& r : *shards) {
    std::vector<proto::Tier> tiers;
    const bool whole =
        r.state() == proto::SHARD_STAGED ||
        r.state() == proto::SHARD_PERSISTED ||
        (r.state() == proto::SHARD_FAILED && !r.slot_path().empty());
    if (whole) tiers.push_back(proto::TIER_MEMORY);
    if (r.state() == proto::SHARD_PERSISTED) {
      tiers.push_back(proto::TIER_LOCAL_DISK);
      if ((replicator_ != nullptr && r.replica_nodes_size() > 0 &&
           r.replica_nodes_size() >= options_.replication.replicas) ||
          r.parity_protected()) {
        tiers.push_back(proto::TIER_PEER);
      }
      if (shared_ != nullptr && shared_->Has(r.job(), r.step(), r.rank())) {
        tiers.push_back(proto::TIER_SHARED);
      }
    }
    if (tiers.empty()) continue;
    absl::StatusOr<std::vector<proto::Tier>> committed =
        coordinator_->Vote(r.job(), r.step(), r.rank(), r.world_size(), tiers);
    if (!committed.ok()) {
      CKPT_LOG_WARN("{}: re-vote after rejoining: {}",
                    Describe(r.job(), r.step(), r.rank()),
                    committed.status().ToString());
      rejoins_seen_ = -1;  // try again on the next round
      continue;
    }
    ++revoted;
    Committed(r.job(), r.step(), *committed);
  }
  CKPT_LOG_INFO("rejoined: voted again for the {} shards this node holds",
                revoted);
  changes_.Bump();
}

std::set<uint64_t> CheckpointService::KeptElsewhere(
    const std::vector<proto::CommitRecord>& commits) const {
  std::set<uint64_t> out;
  auto newest = [&](proto::Tier tier, int keep) {
    std::set<uint64_t> steps;
    for (const proto::CommitRecord& c : commits) {
      if (c.tier() == tier) steps.insert(c.step());
    }
    for (auto it = steps.rbegin(); it != steps.rend() && keep > 0;
         ++it, --keep) {
      out.insert(*it);
    }
  };
  if (replicator_ != nullptr) {
    newest(proto::TIER_PEER, std::max(options_.replication.keep_steps, 1));
  }
  if (shared_ != nullptr) newest(proto::TIER_SHARED, options_.shared.keep);
  return out;
}

void CheckpointService::VoteLater(const proto::ShardRecord& shard,
                                  proto::Tier tier) {
  absl::StatusOr<std::vector<proto::Tier>> committed = coordinator_->Vote(
      shard.job(), shard.step(), shard.rank(), shard.world_size(), {tier});
  if (!committed.ok()) {
    CKPT_LOG_WARN("{}: {}-tier vote failed: {}",
                  Describe(shard.job(), shard.step(), shard.rank()),
                  TierName(tier), committed.status().ToString());
    return;
  }
  Committed(shard.job(), shard.step(), *committed);
  if (shared_ != nullptr && std::find(committed->begin(), committed->end(),
                                      proto::TIER_SHARED) != committed->end()) {
    // What reads the tier alone (a new cluster's tools) sees it committed.
    proto::CommitRecord commit;
    commit.set_job(shard.job());
    commit.set_step(shard.step());
    commit.set_tier(proto::TIER_SHARED);
    commit.set_world_size(shard.world_size());
    commit.set_committed_unix_micros(absl::ToUnixMicros(absl::Now()));
    if (absl::Status s = shared_->MarkCommitted(commit); !s.ok()) {
      CKPT_LOG_WARN("{}: the shared tier's commit marker: {}",
                    Describe(shard.job(), shard.step(), shard.rank()),
                    s.ToString());
    }
  }
  // A commit at this tier may let an older step go there.
  if (!committed->empty()) queue_.RequestGc(shard.job());
  changes_.Bump();  // WaitCommitted looks again
}

void CheckpointService::PeerTierReached(
    const proto::ShardRecord& shard,
    const std::function<void(proto::ShardRecord&)>& record,
    const char* what_recorded) {
  const std::string what = Describe(shard.job(), shard.step(), shard.rank());
  // Garbage collection rewrites records from its own snapshot: not now. And
  // the vote is cast under the same lock as Supersede withdraws one: a shard
  // withdrawn (a trainer resumed from an older step, or saved this step
  // again) gets no peer vote afterwards.
  absl::MutexLock gc(&gc_mu_);
  absl::StatusOr<absl::optional<proto::ShardRecord>> current =
      catalog_->GetShard(shard.job(), shard.step(), shard.rank());
  if (!current.ok() || !current->has_value() ||
      (*current)->shard_path() != shard.shard_path()) {
    return;  // dropped or replaced meanwhile
  }
  record(**current);
  absl::Status put = catalog_->PutShard(**current);
  if (!put.ok()) {
    CKPT_LOG_WARN("{}: recording its {}: {}", what, what_recorded,
                  put.ToString());
  }
  VoteLater(shard, proto::TIER_PEER);
}

void CheckpointService::Replicated(const proto::ShardRecord& shard,
                                   const std::vector<std::string>& nodes) {
  PeerTierReached(
      shard,
      [&nodes](proto::ShardRecord& r) {
        r.clear_replica_nodes();
        for (const std::string& n : nodes) r.add_replica_nodes(n);
      },
      "replicas");
}

void CheckpointService::ParityProtected(const proto::ShardRecord& shard) {
  PeerTierReached(
      shard, [](proto::ShardRecord& r) { r.set_parity_protected(true); },
      "parity");
}

absl::StatusOr<proto::PeerShardOffer> CheckpointService::OfferPeerShard(
    const std::string& job, uint64_t step, uint32_t rank) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> r,
                   catalog_->GetShard(job, step, rank));
  if (r.has_value() && r->state() != proto::SHARD_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(job, step, rank), " is on this node"));
  }
  if (replicator_ == nullptr) {
    return absl::FailedPreconditionError("this node has no peers");
  }
  return replicator_->OfferFromPeers(job, step, rank);
}

absl::StatusOr<proto::FindShardResponse> CheckpointService::FindShard(
    const std::string& job, uint64_t step, uint32_t rank) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  proto::FindShardResponse resp;
  auto add = [&resp](proto::Tier tier, const std::string& node, bool here,
                     const std::string& path) {
    proto::ShardSource* s = resp.add_sources();
    s->set_tier(tier);
    s->set_node(node);
    s->set_here(here);
    s->set_path(path);
  };
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> r,
                   catalog_->GetShard(job, step, rank));
  const std::string& node = options_.replication.node_id;
  if (r.has_value() && r->state() != proto::SHARD_STAGING) {
    if (!r->slot_path().empty() && fs_->Exists(r->slot_path()).value_or(false))
      add(proto::TIER_MEMORY, node, true, r->slot_path());
    if (r->state() == proto::SHARD_PERSISTED && !r->shard_path().empty() &&
        fs_->Exists(r->shard_path()).value_or(false))
      add(proto::TIER_LOCAL_DISK, node, true, r->shard_path());
    if (resp.sources_size() > 0) {
      for (const proto::StagedItem& s : r->items()) {
        *resp.add_items() = s.item();
      }
    }
  }
  if (replicator_ != nullptr) {
    if (absl::optional<proto::ShardRecord> copy =
            replicator_->LocalCopy(job, step, rank)) {
      add(proto::TIER_PEER, node, true, copy->shard_path());
      if (resp.items().empty()) {
        for (const proto::StagedItem& s : copy->items()) {
          *resp.add_items() = s.item();
        }
      }
    }
    for (Replicator::PeerCopy& c : replicator_->Locate(job, step, rank)) {
      add(c.tier, c.node, false, "");
      if (resp.items().empty()) {
        for (proto::Item& item : c.items) *resp.add_items() = std::move(item);
      }
    }
  }
  if (shared_ != nullptr) {
    // Its footer and manifest only: nothing more is read.
    absl::StatusOr<proto::ShardRecord> copy =
        shared_->Find(job, step, rank, /*on_demand=*/true);
    if (copy.ok()) {
      add(proto::TIER_SHARED, "", false, copy->shard_path());
      if (resp.items().empty()) {
        for (const proto::StagedItem& s : copy->items()) {
          *resp.add_items() = s.item();
        }
      }
    }
  }
  if (resp.sources().empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no copy of ", Describe(job, step, rank),
        replicator_ != nullptr ? " here or on a live peer" : " here",
        shared_ != nullptr ? " or in the shared tier" : ""));
  }
  return resp;
}

absl::StatusOr<bool> CheckpointService::SavedHere(const std::string& job,
                                                  uint64_t step,
                                                  uint32_t rank) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> r,
                   catalog_->GetShard(job, step, rank));
  return r.has_value();
}

absl::StatusOr<absl::optional<std::string>> CheckpointService::LocalShardFile(
    const std::string& job, uint64_t step, uint32_t rank) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> r,
                   catalog_->GetShard(job, step, rank));
  if (r.has_value() && r->state() == proto::SHARD_PERSISTED &&
      !r->shard_path().empty()) {
    return absl::optional<std::string>(r->shard_path());
  }
  // A copy of another node's shard (a stand-in's, a restore's).
  if (replicator_ != nullptr) {
    for (ReplicaStore* store : {replicator_->held(), replicator_->fetched()}) {
      if (absl::optional<ReplicaStore::Entry> e =
              store->Find({job, step, rank})) {
        return absl::optional<std::string>(e->path);
      }
    }
  }
  return absl::optional<std::string>();
}

}  // namespace ckpt::daemon
