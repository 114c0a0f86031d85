#include "daemon/peer/peer_authorization.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/common/describe.h"
#include "io/status_macros.h"

namespace ckpt::daemon {
namespace {

std::string DescribeBlock(const proto::ParityBlockKey& key) {
  return absl::StrCat("parity block ", key.index(), " of group ", key.group(),
                      " of job ", key.job(), " step ", key.step());
}

}  // namespace

PeerAuthorization::PeerAuthorization(PlanOf plan_of, HoldsOwn holds_own)
    : plan_of_(std::move(plan_of)), holds_own_(std::move(holds_own)) {}

absl::StatusOr<proto::ParityPlan> PeerAuthorization::Plan(
    const std::string& job, uint64_t step) {
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find({job, step});
    if (it != plans_.end()) return it->second;
  }
  if (!plan_of_) {
    return absl::FailedPreconditionError("this node keeps no parity plans");
  }
  ASSIGN_OR_RETURN(absl::optional<proto::ParityPlan> plan, plan_of_(job, step));
  if (!plan.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job, " step ", step,
                     " has no parity plan in the coordinator yet"));
  }
  absl::MutexLock lock(&mu_);
  if (plans_.size() >= kPlansKept) plans_.erase(plans_.begin());
  plans_[{job, step}] = *plan;
  return *std::move(plan);
}

absl::Status PeerAuthorization::MayContribute(
    const proto::ParityBlockKey& key, const proto::ParityGroup& group,
    uint32_t position, const std::vector<std::string>& callers) {
  ASSIGN_OR_RETURN(proto::ParityPlan plan, Plan(key.job(), key.step()));
  const proto::ParityGroup* planned = nullptr;
  for (const proto::ParityGroup& g : plan.groups()) {
    if (g.group() == key.group()) planned = &g;
  }
  if (planned == nullptr ||
      planned->SerializeAsString() != group.SerializeAsString()) {
    return absl::PermissionDeniedError(
        absl::StrCat("a contribution to ", DescribeBlock(key),
                     " names a group the step's parity plan does not have"));
  }
  if (position >= static_cast<uint32_t>(planned->data_size())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "a contribution to ", DescribeBlock(key), " as data block ", position,
        ": the group has ", planned->data_size()));
  }
  const std::string& holder = planned->data(position).node();
  if (!callers.empty() &&
      std::find(callers.begin(), callers.end(), holder) == callers.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "a contribution to ", DescribeBlock(key), " as data block ", position,
        " comes from ", absl::StrJoin(callers, ", "),
        "; the parity plan has that block on node ", holder));
  }
  return absl::OkStatus();
}

absl::StatusOr<PeerAuthorization::ReplicaClaim> PeerAuthorization::ClaimReplica(
    const ReplicaStore::Key& key, const std::string& from,
    const ReplicaStore& held) {
  ASSIGN_OR_RETURN(bool own, holds_own_(key.job, key.step, key.rank));
  if (own) {
    return absl::PermissionDeniedError(
        absl::StrCat("node ", from, " sent a replica of ", Describe(key),
                     ", which this node saved itself"));
  }
  absl::MutexLock lock(&mu_);
  auto it = senders_.find(key);
  if (it != senders_.end() && it->second != from &&
      held.Find(key).has_value()) {
    return absl::PermissionDeniedError(
        absl::StrCat("node ", from, " sent a replica of ", Describe(key),
                     ", which this node holds for node ", it->second));
  }
  auto [push, first] = pushing_.try_emplace(key, from, 0);
  if (!first && push->second.first != from) {
    return absl::PermissionDeniedError(absl::StrCat(
        "node ", from, " sent a replica of ", Describe(key), " while node ",
        push->second.first, "'s push of it is in flight"));
  }
  ++push->second.second;
  return ReplicaClaim(this, key);
}

PeerAuthorization::ReplicaClaim::~ReplicaClaim() {
  if (auth_ == nullptr) return;
  absl::MutexLock lock(&auth_->mu_);
  auto it = auth_->pushing_.find(key_);
  if (it != auth_->pushing_.end() && --it->second.second == 0) {
    auth_->pushing_.erase(it);
  }
}

void PeerAuthorization::Held(const ReplicaStore::Key& key,
                             const std::string& from,
                             const ReplicaStore& held) {
  absl::MutexLock lock(&mu_);
  senders_[key] = from;
  if (senders_.size() >= prune_at_) {
    std::erase_if(senders_, [&](const auto& entry) {
      return !held.Find(entry.first).has_value();
    });
    prune_at_ = std::max<size_t>(1024, 2 * senders_.size());
  }
}

}  // namespace ckpt::daemon
