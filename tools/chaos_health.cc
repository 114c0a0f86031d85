// Part of ckpt-chaos: see tools/chaos.h. What ckptd counted of the run's
// failures, and the goodput it measured, against what the harness did: the
// faults it injected and the wall time of its job.
#include <cmath>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "proto/daemon.grpc.pb.h"
#include "tools/chaos.h"
#include "tools/metrics_text.h"

namespace ckpt::chaos {
namespace {

using ckpt::tools::Sample;

}  // namespace

absl::StatusOr<std::vector<Sample>> Scrape(const Node& node) {
  grpc::ClientContext context;
  auto stub = DaemonStub(node, &context);
  proto::GetMetricsRequest req;
  proto::GetMetricsResponse resp;
  grpc::Status s = stub->GetMetrics(&context, req, &resp);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat(node.id, ": GetMetrics: ", s.error_message()));
  }
  return ckpt::tools::ParseMetricsText(resp.text());
}

double Chaos::Rejoins(const Node& node) {
  absl::StatusOr<std::vector<Sample>> samples = Scrape(node);
  if (!samples.ok()) return 0;
  return ckpt::tools::SumOf(*samples, "ckpt_coordinator_rejoins", {})
      .value_or(0);
}

double Chaos::NodeLostCounted() {
  double n = 0;
  for (const Node& node : nodes_) {
    absl::StatusOr<std::vector<Sample>> samples = Scrape(node);
    if (!samples.ok()) continue;
    n += ckpt::tools::SumOf(*samples, "ckpt_failures_total",
                            {{"job", kJob}, {"cause", "node_lost"}})
             .value_or(0);
  }
  return n;
}

void Chaos::CheckLeaseLossCounted(const Node& node, double rejoins_before,
                                  double lost_before) {
  // Its next keep-alive finds the lease gone and it takes a new one.
  Clock::time_point until = Clock::now() + std::chrono::seconds(3);
  double rejoins = rejoins_before;
  while (rejoins <= rejoins_before && Clock::now() < until) {
    SleepMs(100);
    rejoins = Rejoins(node);
  }
  if (rejoins <= rejoins_before) return;  // its lease outlived the stop
  report_.leases_expired++;
  // Another node counts it (at once: it watches the membership).
  until = Clock::now() + std::chrono::seconds(3);
  double lost = NodeLostCounted();
  while (lost <= lost_before && Clock::now() < until) {
    SleepMs(100);
    lost = NodeLostCounted();
  }
  Log(absl::StrCat(node.id, "'s lease expired (it rejoined etcd); node_lost ",
                   "counted in the cluster: ", lost, " (", lost_before,
                   " before)"));
  if (lost <= lost_before) {
    Violation(absl::StrCat(node.id,
                           "'s etcd lease expired while it served the job's "
                           "ranks, and no ckptd counted a node_lost"));
  }
}

void Chaos::AwaitSessions(const Node& node, uint32_t victim) {
  uint32_t there = 0;
  for (uint32_t r = 0; r < o_.ranks; ++r) there += &NodeOf(r) == &node;
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(15);
  double attached = 0;
  while (Clock::now() < deadline) {
    absl::StatusOr<std::vector<Sample>> samples = Scrape(node);
    attached = samples.ok()
                   ? ckpt::tools::SumOf(*samples, "ckpt_trainers_attached",
                                        {{"job", kJob}})
                         .value_or(0)
                   : 0;
    if (attached >= there) return;
    SleepMs(50);
  }
  Log(absl::StrCat(node.id, ": ", attached, " of its ", there,
                   " ranks' sessions attached after 15 s (rank ", victim,
                   "'s fault may go unseen)"));
}

namespace {

// A count against the bounds [lo, hi] the faults allow; hi < 0: no upper
// bound.
struct Bounds {
  double lo = 0, hi = -1;
  std::string Text() const {
    if (hi == lo) return absl::StrCat(lo);
    return hi < 0 ? absl::StrCat(">=", lo) : absl::StrCat(lo, "..", hi);
  }
  bool Holds(double n) const { return n >= lo && (hi < 0 || n <= hi); }
};

// The job's goodput split on one node, its wall time and ETTR.
std::map<std::string, double> GoodputOf(const std::vector<Sample>& samples) {
  std::map<std::string, double> g;
  double wall = 0;
  for (const char* kind : {"training", "stall", "recovery", "lost"}) {
    g[kind] = ckpt::tools::SumOf(samples, "ckpt_goodput_seconds",
                                 {{"job", kJob}, {"kind", kind}})
                  .value_or(0);
    wall += g[kind];
  }
  g["wall"] = wall;
  g["ettr"] = wall > 0 ? g["training"] / wall : 0;
  return g;
}

}  // namespace

void Chaos::CheckHealth() {
  report_.wall_s =
      std::chrono::duration<double>(job_ended_ - job_started_).count();
  // The daemons notice the ranks' sessions end (they poll every 50 ms).
  SleepMs(300);
  for (uint32_t n = 0; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
    absl::StatusOr<std::vector<Sample>> samples = Scrape(node);
    if (!samples.ok()) {
      Violation(std::string(samples.status().message()));
      continue;
    }
    for (const char* cause :
         {"trainer_exited", "trainer_hung", "daemon_restart", "node_lost",
          "disk_error", "peer_unreachable", "sdc_suspected",
          "operator_rollback"}) {
      report_.failures_counted[cause] +=
          ckpt::tools::SumOf(*samples, "ckpt_failures_total",
                             {{"job", kJob}, {"cause", cause}})
              .value_or(0);
    }
    if (n >= o_.ranks) continue;  // no rank of the job there
    std::map<std::string, double>& g = report_.goodput[node.id];
    g = GoodputOf(*samples);
    const double wall = g["wall"];
    // The job ended cleanly: its clock has stopped.
    SleepMs(200);
    absl::StatusOr<std::vector<Sample>> later = Scrape(node);
    if (later.ok() && GoodputOf(*later)["wall"] != wall) {
      Violation(absl::StrFormat(
          "%s's goodput clock still runs after the job ended (%.3f s, then "
          "%.3f s)",
          node.id, wall, GoodputOf(*later)["wall"]));
    }
    // A node lost and replaced began its figures anew.
    if (lost_nodes_.count(node.id) > 0) continue;
    if (std::abs(wall - report_.wall_s) > 0.01 * report_.wall_s) {
      Violation(absl::StrFormat(
          "%s's goodput adds up to %.2f s, the job ran %.2f s (more than 1%% "
          "apart): training %.2f, stall %.2f, recovery %.2f, lost %.2f",
          node.id, wall, report_.wall_s, g["training"], g["stall"],
          g["recovery"], g["lost"]));
    }
  }
  // What the faults must have produced. A rank killed: its trainer exited
  // (its peers, stopped with it, are the same incident). A daemon killed, on
  // its own, with its node, at a kill point (it may die there once more) or
  // by a power loss: ckptd restarted under the job. A disk that failed (or
  // lost its power) while persists ran: one disk error per episode. A rank
  // stopped past --trainer-hung-after: one hung trainer.
  auto faults = [&](std::initializer_list<const char*> kinds) {
    double n = 0;
    for (const char* k : kinds) {
      auto it = report_.faults.find(k);
      if (it != report_.faults.end()) n += it->second;
    }
    return n;
  };
  const double killed_rank = faults({"kill_trainer"});
  const double restarts = faults({"kill_daemon", "kill_node", "power_loss",
                                  "kill_during_gc", "kill_during_replication"});
  const double twice = faults({"kill_during_gc", "kill_during_replication"});
  const double disk = faults({"disk_enospc", "disk_eio", "fsync_eio"});
  std::map<std::string, Bounds> expected;
  expected["trainer_exited"] = {killed_rank};
  expected["daemon_restart"] = {restarts};
  // (No upper bound: a persist that writes nothing new, all its chunks
  // unchanged, succeeds inside a window and ends the episode.)
  expected["disk_error"] = {disk > 0 ? 1.0 : 0.0};
  // (A node lost and replaced took the counts its ckptd had made.)
  const double hangs = faults({"hang_trainer"}) - hangs_forgotten_;
  expected["trainer_hung"] = {hangs, hangs};
  expected["sdc_suspected"] = {0, 0};
  expected["operator_rollback"] = {0, 0};
  if (!multi()) {
    // One node sees every failure once.
    expected["trainer_exited"].hi = killed_rank + restarts + twice;
    expected["daemon_restart"].hi = restarts + twice;
  } else {
    // Several nodes: each counts what it saw (a rank killed is a trainer
    // exit on every node; a node lost with its data restarts nothing).
    expected.erase("daemon_restart");
    expected["disk_error"].lo = 0;
  }
  // A node serving ranks whose lease expired: once in the cluster. Each
  // fault that took a daemon down may have let its lease expire (a restart
  // slower than the TTL); etcd killed, every node's.
  const double down = restarts + twice +
                      faults({"lose_node", "stop_past_lease", "stop_daemon"}) +
                      faults({"kill_etcd"}) * o_.nodes;
  // (Each lease that expired was checked to be counted right then; a node
  // lost since may have taken the count it made with it.)
  expected["node_lost"] = {faults({"lose_node"}) > 0
                               ? 0.0
                               : static_cast<double>(report_.leases_expired),
                           multi() ? down : 0.0};
  // A replica's push that found its peer down: seen only when a push was
  // under way, as often as the peers went down.
  if (!multi()) expected["peer_unreachable"] = {0, 0};
  const double incidents = report_.failures_counted["trainer_exited"] +
                           report_.failures_counted["daemon_restart"];
  for (const auto& [cause, bounds] : expected) {
    report_.failures_expected[cause] = bounds.Text();
    const double n = report_.failures_counted[cause];
    if (!bounds.Holds(n)) {
      Violation(absl::StrCat("ckptd counted ", n, " ", cause,
                             " failure(s); the faults injected make ",
                             bounds.Text()));
    }
  }
  if (!multi() && incidents > killed_rank + restarts + twice) {
    Violation(absl::StrCat("ckptd counted ", incidents,
                           " trainer exits and daemon restarts; the faults "
                           "injected stopped the job at most ",
                           killed_rank + restarts + twice, " times"));
  }
}

}  // namespace ckpt::chaos
