// Part of ckpt-chaos: see tools/chaos.h.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "io/file_system.h"
#include "io/unsynced_journal.h"
#include "proto/daemon.grpc.pb.h"
#include "tools/chaos.h"

namespace ckpt::chaos {

std::vector<std::string> Chaos::Kinds(bool several_nodes, bool object_store) {
  std::vector<std::string> kinds = {
      "kill_trainer", "kill_daemon", "kill_node", "stop_daemon",
      "disk_enospc",  "disk_eio",    "fsync_eio", "kill_during_gc",
      "power_loss",   "hang_trainer"};
  if (several_nodes) {
    for (const char* k : {"lose_node", "stop_past_lease", "kill_etcd",
                          "kill_during_replication"}) {
      kinds.push_back(k);
    }
  }
  if (several_nodes && object_store) {
    kinds.push_back("kill_object_store");
    kinds.push_back("object_store_errors");
  }
  return kinds;
}

void Chaos::InjectOne() {
  const std::vector<std::string> kinds =
      o_.kinds.empty() ? Kinds(multi(), o_.object_store) : o_.kinds;
  const std::string kind =
      kinds[std::uniform_int_distribution<size_t>(0, kinds.size() - 1)(rng_)];
  Node& node =
      nodes_[std::uniform_int_distribution<uint32_t>(0, o_.nodes - 1)(rng_)];
  report_.faults[kind]++;
  uint64_t before = Latest(proto::TIER_MEMORY).value_or(0);
  const Clock::time_point t0 = Clock::now();
  std::optional<uint64_t> resumed;
  uint64_t computed = 0;  // the furthest step the killed job had computed
  std::optional<double> rejoins_before;  // stop_past_lease on a rank's node
  auto pause = [&](int lo, int hi) {
    SleepMs(std::uniform_int_distribution<int>(lo, hi)(rng_));
  };
  Log(absl::StrCat("fault ", kind, multi() ? " on " + node.id : "",
                   " (latest committed in memory: ", before, ")"));
  if (kind == "kill_trainer") {
    const uint32_t victim =
        std::uniform_int_distribution<uint32_t>(0, o_.ranks - 1)(rng_);
    AwaitSessions(NodeOf(victim), victim);
    KillAndReap(std::exchange(ranks_[victim], -1));
    KillRanks();  // the job restarts, as under torchrun
    computed = Progress();
    resumed = Latest(proto::TIER_MEMORY).value_or(0);
    StartRanks(proto::TIER_MEMORY);
  } else if (kind == "kill_daemon") {
    KillAndReap(std::exchange(node.pid, -1));
    pause(0, 500);
    if (!StartDaemon(node, "")) return;
  } else if (kind == "kill_node") {
    computed = KillNode(node);
    pause(0, 300);
    if (!StartDaemon(node, "")) return;
    resumed = Latest(proto::TIER_MEMORY).value_or(0);
    StartRanks(proto::TIER_MEMORY);
  } else if (kind == "lose_node") {
    // The machine is replaced: nothing of what it had comes back, and its
    // replacement takes its id, sooner or later than its lease expires.
    computed = KillNode(node);
    lost_nodes_.insert(node.id);
    hangs_forgotten_ += std::exchange(hangs_on_node_[node.id], 0);
    // Steps the node voted for before it died may still get committed (the
    // other ranks' votes complete them) with its shards gone: committed at
    // the memory and disk tiers only, they are lost with it, as those tiers
    // allow. What counts is newer than all of them.
    before = std::max(before, Latest(proto::TIER_MEMORY).value_or(0));
    std::error_code ec;
    std::filesystem::remove_all(node.data(), ec);
    std::filesystem::remove_all(node.staging, ec);
    std::filesystem::remove_all(node.replicas(), ec);
    pause(0, 1000 * kLeaseTtlS + 1000);
    if (!StartDaemon(node, "")) return;
    // Its memory-tier shards are gone: the job resumes from the peer tier,
    // which the other nodes' replicas keep.
    resumed = Latest(proto::TIER_PEER).value_or(0);
    StartRanks(proto::TIER_PEER);
  } else if (kind == "hang_trainer") {
    // The rank's process lives on but makes no progress (a collective that
    // never returns): ckptd sees its session open and no save.
    const uint32_t victim =
        std::uniform_int_distribution<uint32_t>(0, o_.ranks - 1)(rng_);
    AwaitSessions(NodeOf(victim), victim);
    hangs_on_node_[NodeOf(victim).id]++;
    ::kill(ranks_[victim], SIGSTOP);
    pause(1000 * kHungAfterS + 1500, 1000 * kHungAfterS + 3000);
    ::kill(ranks_[victim], SIGCONT);
  } else if (kind == "stop_daemon") {
    ::kill(node.pid, SIGSTOP);
    pause(300, multi() ? 1000 * kLeaseTtlS - 500 : 1500);
    ::kill(node.pid, SIGCONT);
  } else if (kind == "stop_past_lease") {
    // Fenced: it can neither commit nor collect until it rejoined. With
    // ranks of the job there (their sessions open and kept with its
    // membership: NodeWatch's rounds are 500 ms), its loss is the job's.
    const uint32_t index = static_cast<uint32_t>(&node - nodes_.data());
    double lost_before = 0;
    if (index < o_.ranks) {
      AwaitSessions(node, index);
      SleepMs(1100);
      rejoins_before = Rejoins(node);
      lost_before = NodeLostCounted();
    }
    ::kill(node.pid, SIGSTOP);
    pause(1000 * kLeaseTtlS + 500, 1000 * kLeaseTtlS + 2500);
    ::kill(node.pid, SIGCONT);
    if (rejoins_before.has_value())
      CheckLeaseLossCounted(node, *rejoins_before, lost_before);
  } else if (kind == "kill_etcd") {
    etcd_->Kill();
    pause(100, 2000);
    if (!etcd_->Start()) {
      Violation("etcd did not start again; see " + etcd_->log_path());
      return;
    }
  } else if (kind == "power_loss") {
    // Steps the node voted for before it died may still get committed with
    // its memory-tier shards gone: what counts is newer than all of them.
    computed = PowerLoss(node);
    if (node.pid <= 0) return;
    before = std::max(before, Latest(proto::TIER_MEMORY).value_or(0));
    resumed = Latest(proto::TIER_LOCAL_DISK).value_or(0);
    StartRanks(proto::TIER_LOCAL_DISK);
  } else if (kind == "kill_during_replication") {
    // The sender dies between the pieces of a replica, or a receiver as one
    // arrives (with parity: a data node between the segments of its
    // contribution, or a parity holder as a piece arrives).
    const bool sender = std::uniform_int_distribution<int>(0, 1)(rng_) == 0;
    const char* point =
        o_.peer_redundancy.empty()
            ? (sender ? "replicator.piece_sent" : "peer.piece_received")
            : (sender ? "parity.segment_sent" : "peer.parity_piece_received");
    const int nth = std::uniform_int_distribution<int>(1, 4)(rng_);
    if (!KillAt(node, absl::StrCat(point, ":", nth))) return;
  } else if (kind == "kill_object_store" || kind == "object_store_errors") {
    ObjectStoreFault(kind);
  } else if (kind == "kill_during_gc") {
    const int nth = std::uniform_int_distribution<int>(1, 3)(rng_);
    if (!KillAt(node, absl::StrCat("service.gc_after_catalog:", nth))) return;
  } else {
    const int write_errno = kind == "disk_enospc" ? ENOSPC
                            : kind == "disk_eio"  ? EIO
                                                  : 0;
    const int fsync_errno = kind == "fsync_eio" ? EIO : 0;
    absl::Status s = InjectDisk(node, write_errno, fsync_errno);
    if (!s.ok()) Violation(std::string(s.message()));
    pause(300, 1500);
    s = InjectDisk(node, 0, 0);
    if (!s.ok()) Violation(std::string(s.message()));
  }
  if (resumed.has_value()) {
    report_.steps_lost.push_back(computed > *resumed ? computed - *resumed : 0);
  }
  // Recovered: a step newer than any before the fault is committed in
  // memory and on disk (training and persisting both resumed). After a
  // node's loss, every step retention promises at those tiers is newer: the
  // older ones may have been lost with the node.
  // The lost node's memory tier is gone with it (and with its power): every
  // step retention promises there must be newer. Its disk survives a power
  // loss (and the steps committed there were checked right after it).
  const bool lost = kind == "lose_node";
  const bool memory_lost = lost || kind == "power_loss";
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(90);
  bool recovered = false;
  while (Clock::now() < deadline && !recovered) {
    recovered =
        NewestAbove(proto::TIER_MEMORY, memory_lost ? kKeepMemory : 1,
                    before) &&
        NewestAbove(proto::TIER_LOCAL_DISK, lost ? kKeepDisk : 1, before);
    if (!recovered) {
      ReapDeadDaemons();
      SleepMs(50);
    }
  }
  if (!recovered) {
    Violation(absl::StrCat("no new step committed in memory and on disk ",
                           "within 90 s of ", kind, "; see ", o_.dir));
    return;
  }
  report_.recoveries++;
  report_.recover_s.push_back(SecondsSince(t0));

  const Clock::time_point checked = Clock::now();
  const size_t steps_before = checked_steps_;
  CheckInvariants(kind);
  Log(absl::StrFormat(
      "recovered in %.1f s; %d committed steps checked in %.1f s",
      report_.recover_s.back(), checked_steps_ - steps_before,
      SecondsSince(checked)));
}

bool Chaos::KillAt(Node& node, const std::string& kill_point) {
  KillAndReap(std::exchange(node.pid, -1));
  if (!StartDaemon(node, "CKPT_KILL_POINT=" + kill_point)) return false;
  if (node.died_at_start) {
    // Reached during its start-up (recovery collects garbage too), and
    // started again without the kill point: killing that one would be one
    // restart more than the fault makes.
    report_.kill_points_reached++;
    Log(absl::StrCat(node.id, ": ", kill_point, " reached at start-up"));
    return true;
  }
  // It dies at the kill point if the point is reached soon; restart it
  // normally either way.
  int status = 0;
  bool died = false;
  for (int i = 0; i < 200 && !died; ++i) {
    died = Exited(node.pid, &status);
    if (!died) SleepMs(25);
  }
  if (died) {
    node.pid = -1;
    report_.kill_points_reached++;
  }
  KillAndReap(std::exchange(node.pid, -1));
  Log(absl::StrCat(node.id, ": ", kill_point,
                   died ? " reached" : " not reached within 5 s"));
  return StartDaemon(node, "");
}

void Chaos::ObjectStoreFault(const std::string& kind) {
  auto pause = [&](int lo, int hi) {
    SleepMs(std::uniform_int_distribution<int>(lo, hi)(rng_));
  };
  if (kind == "kill_object_store") {
    s3_->Kill();
    pause(0, 3000);
    if (!s3_->Start()) {
      Violation("the S3 server did not start again; see " + s3_->log_path());
    }
    return;
  }
  using Fault = ckpt::tools::FaultProxy::Fault;
  constexpr Fault kFaults[] = {Fault::kStatus500, Fault::kStatus503,
                               Fault::kReset, Fault::kSlow, Fault::kCorrupt};
  const int requests = std::uniform_int_distribution<int>(5, 40)(rng_);
  for (int i = 0; i < requests; ++i) {
    proxy_->Arm(kFaults[std::uniform_int_distribution<size_t>(
                    0, std::size(kFaults) - 1)(rng_)],
                1);
  }
  const int before = proxy_->injected();
  pause(300, 1500);
  Log(absl::StrCat(requests, " faulty answers armed; ",
                   proxy_->injected() - before, " given so far"));
}

uint64_t Chaos::PowerLoss(Node& node) {
  std::error_code ec;
  std::filesystem::remove(PowerLossPlan(node), ec);
  absl::Status cut = CutPower(node);
  const uint64_t computed = KillNode(node);
  if (!cut.ok()) {
    Violation(std::string(cut.message()));
    return computed;
  }
  // Writes the dead daemon queued before the cut land before the plan runs.
  SleepMs(100);
  absl::StatusOr<std::string> plan = ckpt::io::ReadFileToString(
      ckpt::io::DefaultFileSystem(), PowerLossPlan(node));
  absl::Status applied = plan.ok() ? ckpt::io::ApplyPowerLossPlan(
                                         ckpt::io::DefaultFileSystem(), *plan)
                                   : plan.status();
  if (!applied.ok()) {
    Violation(
        absl::StrCat(node.id, ": the power-loss plan: ", applied.message()));
    return computed;
  }
  Log(absl::StrCat(node.id, ": power lost; ",
                   std::count(plan->begin(), plan->end(), '\n'),
                   " file operations undone, see ", PowerLossPlan(node)));
  std::filesystem::remove_all(node.staging, ec);
  std::filesystem::remove_all(node.replicas(), ec);
  if (!StartDaemon(node, "")) return computed;
  // Nothing committed on disk is lost: check the disk (and, with several
  // nodes, the peer and shared) tiers now, before the job trains on.
  std::vector<std::pair<proto::Tier, size_t>> durable;
  for (const auto& promise : Promises()) {
    if (promise.first != proto::TIER_MEMORY) durable.push_back(promise);
  }
  CheckInvariants("power_loss on " + node.id, durable);
  return computed;
}

}  // namespace ckpt::chaos
