// ParityTier: after a loss, the lost data shards of each group are rebuilt
// ahead of any restore, each by one live node that keeps a copy in the lost
// node's place (DataStandIns), so that the group again survives m losses and
// the restore of a lost rank is a plain fetch.
#include <grpcpp/grpcpp.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "daemon/common/describe.h"
#include "daemon/peer/parity_plan.h"
#include "daemon/peer/parity_tier.h"
#include "io/background.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/peer.grpc.pb.h"

namespace ckpt::daemon {

void ParityTier::SetRepair(Repair repair) {
  absl::MutexLock lock(&mu_);
  repair_ = std::move(repair);
}

void ParityTier::RepairLostData() {
  absl::MutexLock lock(&mu_);
  repair_wanted_ = true;
}

void ParityTier::RepairLoop() {
  io::EnterBackground();
  while (true) {
    Repair repair;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || repair_wanted_;
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      repair_wanted_ = false;
      repair = repair_;
    }
    if (!repair) continue;
    absl::StatusOr<std::vector<proto::ParityPlan>> plans =
        coordinator_->ListParityPlans();
    absl::StatusOr<std::map<std::string, proto::PeerInfo>> live = LivePeers();
    if (!plans.ok() || !live.ok()) {
      CKPT_LOG_WARN("looking for lost data shards to rebuild: {}",
                    (plans.ok() ? live.status() : plans.status()).ToString());
      continue;
    }
    std::set<std::string> live_ids;
    for (const auto& [id, info] : *live) live_ids.insert(id);
    for (const proto::ParityPlan& plan : *plans) {
      RepairPlan(plan, live_ids, repair);
    }
  }
}

void ParityTier::RepairPlan(const proto::ParityPlan& plan,
                            const std::set<std::string>& live,
                            const Repair& repair) {
  for (const proto::ParityGroup& group : plan.groups()) {
    const std::vector<std::string> stand_ins = DataStandIns(group, live);
    for (int i = 0; i < group.data_size(); ++i) {
      if (stand_ins[i] != options_.node_id) continue;
      const proto::ShardHolder& lost = group.data(i);
      const std::string what = Describe(plan.job(), plan.step(), lost.rank());
      absl::StatusOr<absl::optional<std::string>> here =
          local_file_(plan.job(), plan.step(), lost.rank());
      if (here.ok() && here->has_value()) continue;  // kept here already
      const absl::Time start = absl::Now();
      // The replicator's fetch: a live node's copy if one has it, else a
      // rebuild from the group; kept here and checked chunk by chunk.
      absl::Status kept = repair(plan.job(), plan.step(), lost.rank());
      if (!kept.ok()) {
        CKPT_LOG_WARN("{} (lost with node {}): not rebuilt ahead: {}", what,
                      lost.node(), kept.ToString());
        continue;
      }
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      metrics_->Add("ckpt_parity_stand_in_shards_total", {{"job", plan.job()}},
                    1);
      CKPT_LOG_INFO(
          "{}: lost with node {}, rebuilt ahead of any restore and kept here "
          "in its place ({} group {}) in {:.1f} ms",
          what, lost.node(), code_.ToString(), group.group(), seconds * 1e3);
    }
  }
}

absl::optional<std::string> ParityTier::CopyHolder(
    const proto::ParityPlan& plan, const proto::ShardHolder& shard,
    const std::map<std::string, proto::PeerInfo>& live) {
  absl::StatusOr<absl::optional<std::string>> here =
      local_file_(plan.job(), plan.step(), shard.rank());
  if (here.ok() && here->has_value()) return options_.node_id;
  proto::LocateShardRequest req;
  req.mutable_shard()->set_job(plan.job());
  req.mutable_shard()->set_step(plan.step());
  req.mutable_shard()->set_rank(shard.rank());
  for (const auto& [id, peer] : live) {
    if (id == options_.node_id) continue;
    auto stub = proto::CkptPeer::NewStub(channel_to_(peer.address()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    proto::LocateShardResponse resp;
    if (stub->LocateShard(&ctx, req, &resp).ok() &&
        resp.tier() != proto::TIER_UNSPECIFIED) {
      return id;
    }
  }
  return absl::nullopt;
}

}  // namespace ckpt::daemon
