#include "daemon/health/node_watch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "io/logging.h"

namespace ckpt::daemon {

NodeWatch::NodeWatch(Coordinator* coordinator, std::string node,
                     FailureLog* failures, ServedJobs served)
    : coordinator_(coordinator),
      node_(std::move(node)),
      failures_(failures),
      served_(std::move(served)) {
  thread_ = std::thread([this] { Loop(); });
}

NodeWatch::~NodeWatch() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

bool NodeWatch::Stopping() {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void NodeWatch::Loop() {
  int64_t revision = 0;
  absl::Time warned = absl::InfinitePast();
  bool healed = false;
  while (!Stopping()) {
    KeepServedJobs();
    absl::StatusOr<std::vector<Coordinator::MemberChange>> changes =
        coordinator_->WatchMemberChanges(&revision, kRound);
    if (absl::IsUnimplemented(changes.status())) return;  // one node
    if (!changes.ok()) {
      if (absl::Now() - warned > absl::Minutes(1)) {
        warned = absl::Now();
        CKPT_LOG_WARN("watching the cluster's nodes come and go: {}",
                      changes.status().ToString());
      }
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), kRound);
      continue;
    }
    // Watching from here on: whoever is here was not lost (an episode kept
    // from before ckptd restarted heals).
    if (!healed) {
      HealLiveNodes();
      healed = true;
    }
    const absl::Time now = absl::Now();
    for (const Coordinator::MemberChange& c : *changes) {
      if (c.node == node_) continue;
      if (c.joined) {
        failures_->Healed("", "node_lost", now, c.node);
      } else {
        Left(c, now);
      }
    }
  }
}

void NodeWatch::HealLiveNodes() {
  absl::StatusOr<Coordinator::Membership> m =
      coordinator_->WatchMembers(0, absl::ZeroDuration());
  if (!m.ok()) return;
  for (const std::string& node : m->nodes) {
    failures_->Healed("", "node_lost", absl::Now(), node);
  }
}

void NodeWatch::KeepServedJobs() {
  std::vector<std::string> jobs = served_();
  std::sort(jobs.begin(), jobs.end());
  if (kept_.has_value() && *kept_ == jobs) return;
  absl::Status s = coordinator_->SetServedJobs(jobs);
  // Fenced: the coordinator writes them with its next lease.
  if (s.ok() || absl::IsFailedPrecondition(s)) {
    kept_ = std::move(jobs);
  } else if (absl::Now() - keep_warned_ > absl::Minutes(1)) {
    keep_warned_ = absl::Now();  // tried again next round
    CKPT_LOG_WARN("keeping the jobs node {} serves with its membership: {}",
                  node_, s.ToString());
  }
}

void NodeWatch::Left(const Coordinator::MemberChange& change, absl::Time at) {
  absl::StatusOr<bool> claimed =
      coordinator_->ClaimDeparture(change.node, change.lease, node_);
  if (!claimed.ok()) {
    CKPT_LOG_WARN("node {} left; claiming its departure: {}", change.node,
                  claimed.status().ToString());
    return;
  }
  if (!*claimed) return;  // it stopped, or another node counts it
  CKPT_LOG_WARN("node {} lost: its etcd lease expired{}", change.node,
                change.jobs.empty()
                    ? std::string(" (it served no trainers)")
                    : absl::StrCat(" while it served jobs ",
                                   absl::StrJoin(change.jobs, ", ")));
  for (const std::string& job : change.jobs) {
    failures_->FailedEpisode(
        job, "node_lost",
        absl::StrCat("node ", change.node,
                     "'s etcd lease expired while trainers of the job ran "
                     "there (seen by ",
                     node_, ")"),
        at, change.node);
  }
}

}  // namespace ckpt::daemon
