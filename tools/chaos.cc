// ckpt-chaos: starts a local cluster (one ckptd with the fault-injecting file
// system and N rank processes of the deterministic demo model; or, with
// --nodes M > 1, an etcd and M nodes, each a ckptd with peer replication and a
// shared tier, the ranks spread over them), injects faults on a seeded random
// schedule, and after every recovery checks that nothing committed was lost:
//   - every committed step restores byte-exact against the state the harness
//     computes itself (the model is deterministic: the expected state of each
//     step is known outside the system);
//   - a step that is not committed is not restorable (or, if it got committed
//     meanwhile, restores exactly);
//   - the latest committed step, per tier, never goes backward;
//   - the newest committed step at each tier is always restorable;
//   - the job ends with the state of an uninterrupted run.
// Faults: SIGKILL of a rank (the job restarts), of a daemon, of a whole node
// (daemon and ranks); SIGSTOP of a daemon, then SIGCONT; disk faults switched
// on and off (ENOSPC and EIO on writes, EIO on fsync); a daemon killed in the
// middle of garbage collection. With several nodes also: a node lost with its
// directories and replaced under its id (the job resumes from the peer tier),
// a daemon stopped past its etcd lease (fenced, then it rejoins), etcd killed
// and restarted. Exit 1 on any violation.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/daemon.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "tools/demo_model.h"
#include "tools/process.h"

namespace {

namespace proto = ckpt::proto;
using ckpt::tools::Sibling;
using ckpt::tools::Spawn;
using Clock = std::chrono::steady_clock;
using ckpt::client::Checkpointer;

constexpr char kJob[] = "chaos";
// ckptd's retention in the harness's cluster.
constexpr size_t kKeepMemory = 2;
constexpr size_t kKeepDisk = 2;
constexpr size_t kKeepShared = 2;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void SleepMs(int64_t ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// True once `pid` has exited (reaped); `status` gets its wait status.
bool Exited(pid_t pid, int* status) {
  return ::waitpid(pid, status, WNOHANG) == pid;
}

void KillAndReap(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

// The state the harness expects of each rank after each step: the demo model
// run from scratch, outside the system.
class Oracle {
 public:
  explicit Oracle(int64_t elements) : elements_(elements) {}

  std::string Expected(uint32_t rank, uint64_t step) {
    auto it = cache_.find(rank);
    if (it == cache_.end() || it->second.first > step) {
      it = cache_
               .insert_or_assign(
                   rank, std::make_pair(uint64_t{0},
                                        ckpt::demo::RankModel(rank, elements_)))
               .first;
    }
    auto& [at, model] = it->second;
    while (at < step) model.Step(++at);
    return model.Serialize();
  }

 private:
  const int64_t elements_;
  std::map<uint32_t, std::pair<uint64_t, ckpt::demo::RankModel>> cache_;
};

struct Options {
  std::string dir;
  uint32_t nodes = 1;
  uint32_t ranks = 2;
  int64_t elements = 16384;
  int step_ms = -1;  // default: 10 ms on one node, 50 ms on several
  uint64_t seed = 0;
  int faults = 30;
  double duration_s = 0;
  bool json = false;
  // Each ckptd's --memory-budget: a small one makes every save evict
  // copies that are safe on disk.
  std::string memory_budget = "512M";
  std::string ckptd, trainer;
};

struct Report {
  std::map<std::string, int> faults;
  int recoveries = 0;
  std::vector<double> recover_s;
  std::vector<uint64_t> steps_lost;
  uint64_t bytes_staged = 0;
  uint64_t final_step = 0;
  std::vector<std::string> violations;
};

// One node of the cluster: a ckptd with its directories (and, with several
// nodes, its peer service), and the ranks placed on it.
struct Node {
  std::string id;
  std::string dir;      // data directory, socket, log
  std::string staging;  // tmpfs: the memory tier
  pid_t pid = -1;
  std::string socket() const { return dir + "/run/ckptd.sock"; }
  std::string data() const { return dir + "/data"; }
  std::string log() const { return dir + "/ckptd.log"; }
  std::string replicas() const { return staging + ".peer"; }
};

class Chaos {
 public:
  explicit Chaos(const Options& o)
      : o_(o),
        rng_(o.seed),
        check_rng_(o.seed + 1),
        oracle_(o.elements),
        log_(o.dir + "/chaos.log"),
        steps_file_(o.dir + "/end-step") {
    for (uint32_t n = 0; n < o.nodes; ++n) {
      Node node;
      node.id = absl::StrCat("node-", n);
      node.dir = o.nodes == 1 ? o.dir : absl::StrCat(o.dir, "/", node.id);
      node.staging =
          o.nodes == 1
              ? absl::StrCat("/dev/shm/ckpt-chaos-staging-", ::getpid())
              : absl::StrCat("/dev/shm/ckpt-chaos-", ::getpid(), "-", node.id);
      nodes_.push_back(node);
    }
    if (multi())
      etcd_ = std::make_unique<ckpt::tools::LocalEtcd>(o.dir + "/etcd");
  }

  ~Chaos() {
    for (pid_t& p : ranks_) KillAndReap(std::exchange(p, -1));
    std::error_code ec;
    for (Node& n : nodes_) {
      if (n.pid > 0) ::kill(n.pid, SIGCONT);
      KillAndReap(std::exchange(n.pid, -1));
      std::filesystem::remove_all(n.staging, ec);
      std::filesystem::remove_all(n.replicas(), ec);
    }
  }

  int Run() {
    std::filesystem::create_directories(o_.dir + "/out");
    std::filesystem::remove(steps_file_);
    if (multi() && !etcd_->Start()) {
      Violation("etcd did not start; see " + etcd_->log_path());
      return Print();
    }
    for (Node& n : nodes_) {
      if (!StartDaemon(n, "")) return Print();
    }
    StartRanks(proto::TIER_MEMORY);
    const Clock::time_point begin = Clock::now();
    for (int i = 0; o_.faults == 0 || i < o_.faults; ++i) {
      if (o_.duration_s > 0 && SecondsSince(begin) > o_.duration_s) break;
      if (!Train(std::uniform_int_distribution<int>(300, 1200)(rng_))) break;
      InjectOne();
      if (!report_.violations.empty() && report_.violations.size() > 20) break;
    }
    Finish();
    return Print();
  }

 private:
  // The lease of each ckptd on etcd: a daemon stopped longer is fenced.
  static constexpr int kLeaseTtlS = 2;
  // Every this many steps also go to the shared tier (several nodes).
  static constexpr int kSharedEvery = 4;

  bool multi() const { return o_.nodes > 1; }
  Node& NodeOf(uint32_t rank) { return nodes_[rank % o_.nodes]; }
  // The tiers whose commits the harness checks, and how many of the newest
  // commits at each retention keeps restorable. At the peer tier that is the
  // newest one only: a node's loss takes the replicas it held, and a replica's
  // owner keeps its own copy for the newest peer-committed step.
  std::vector<std::pair<proto::Tier, size_t>> Promises() const {
    std::vector<std::pair<proto::Tier, size_t>> p = {
        {proto::TIER_MEMORY, kKeepMemory}, {proto::TIER_LOCAL_DISK, kKeepDisk}};
    if (multi()) {
      p.push_back({proto::TIER_PEER, 1});
      p.push_back({proto::TIER_SHARED, kKeepShared});
    }
    return p;
  }

  // --- the cluster --------------------------------------------------------

  bool StartDaemon(Node& node, const std::string& env) {
    std::vector<std::string> args = {o_.ckptd,
                                     "--socket",
                                     node.socket(),
                                     "--data-dir",
                                     node.data(),
                                     "--staging-dir",
                                     node.staging,
                                     "--memory-budget",
                                     o_.memory_budget,
                                     "--keep-memory",
                                     std::to_string(kKeepMemory),
                                     "--keep-disk",
                                     std::to_string(kKeepDisk),
                                     "--fault-injection"};
    if (multi()) {
      for (const std::string& a :
           {std::string("--coordinator"), "etcd://" + etcd_->endpoint(),
            std::string("--lease-ttl"), std::to_string(kLeaseTtlS),
            std::string("--node-id"), node.id, std::string("--failure-domain"),
            node.id, std::string("--peer-address"), std::string("127.0.0.1:0"),
            std::string("--peer-replicas"), std::string("1"),
            std::string("--shared-dir"), o_.dir + "/shared",
            std::string("--shared-every"), std::to_string(kSharedEvery),
            std::string("--keep-shared"), std::to_string(kKeepShared)}) {
        args.push_back(a);
      }
    }
    std::error_code ec;
    std::filesystem::create_directories(node.dir, ec);
    node.pid = Spawn(args, node.log(), env);
    for (int i = 0; i < 400; ++i) {
      int status;
      if (Exited(node.pid, &status)) {
        node.pid = -1;
        // A kill point may fire during start-up recovery (GC runs then too).
        if (!env.empty()) return StartDaemon(node, "");
        Violation(absl::StrCat(node.id,
                               "'s ckptd exited at start (wait status ", status,
                               "); see ", node.log()));
        return false;
      }
      if (ConnectTo(node, 0) != nullptr) return true;
      SleepMs(25);
    }
    Violation(node.id + "'s ckptd did not start listening; see " + node.log());
    return false;
  }

  // Starts the job's ranks, resuming from the latest step committed at
  // `resume` (the orchestrator's choice: peer after a node was lost).
  void StartRanks(proto::Tier resume) {
    const std::string tier = resume == proto::TIER_PEER ? "peer" : "memory";
    ranks_.assign(o_.ranks, -1);
    for (uint32_t r = 0; r < o_.ranks; ++r) {
      ranks_[r] = Spawn({o_.trainer,
                         "--socket",
                         NodeOf(r).socket(),
                         "--job",
                         kJob,
                         "--rank",
                         std::to_string(r),
                         "--world",
                         std::to_string(o_.ranks),
                         "--steps",
                         std::to_string(uint64_t{1} << 40),
                         "--steps-file",
                         steps_file_,
                         "--elements",
                         std::to_string(o_.elements),
                         "--step-ms",
                         std::to_string(o_.step_ms),
                         "--out",
                         o_.dir + "/out",
                         "--progress-file",
                         ProgressFile(r),
                         "--resume-tier",
                         tier},
                        log_);
    }
  }

  std::string ProgressFile(uint32_t rank) const {
    return absl::StrCat(o_.dir, "/out/progress-rank-", rank);
  }
  // The furthest step any rank has computed.
  uint64_t Progress() const {
    uint64_t furthest = 0;
    for (uint32_t r = 0; r < o_.ranks; ++r) {
      uint64_t step = 0;
      std::ifstream(ProgressFile(r)) >> step;
      furthest = std::max(furthest, step);
    }
    return furthest;
  }

  // Kills every rank, then waits until the daemon has handled what they sent
  // before they died (a commit may still land just after): a restarted job's
  // ranks must all see the same latest step, as an orchestrator's restart
  // delay ensures.
  void KillRanks() {
    for (pid_t& p : ranks_) KillAndReap(std::exchange(p, -1));
    std::optional<uint64_t> last = Latest(proto::TIER_MEMORY);
    for (int stable = 0, i = 0; stable < 5 && i < 200; ++i) {
      SleepMs(50);
      std::optional<uint64_t> now = Latest(proto::TIER_MEMORY);
      stable = now == last ? stable + 1 : 0;
      last = now;
    }
  }

  // Lets the job train for `ms`; false (with a violation) if a rank died.
  bool Train(int ms) {
    const Clock::time_point until =
        Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until) {
      for (uint32_t r = 0; r < ranks_.size(); ++r) {
        int status;
        if (ranks_[r] > 0 && Exited(ranks_[r], &status)) {
          ranks_[r] = -1;
          Violation(absl::StrCat("rank ", r, " exited on its own (status ",
                                 status, "); see ", log_));
          return false;
        }
      }
      SleepMs(20);
    }
    return true;
  }

  // The harness's own checkpointers only read (the trainers are processes):
  // their restores never withdraw a trainer's shards.
  std::unique_ptr<Checkpointer> ConnectTo(const Node& node, uint32_t rank) {
    auto c = Checkpointer::Connect({.job = kJob,
                                    .rank = rank,
                                    .world_size = o_.ranks,
                                    .socket_path = node.socket(),
                                    .rpc_timeout = absl::Seconds(5),
                                    .read_only = true});
    return c.ok() ? *std::move(c) : nullptr;
  }
  std::unique_ptr<Checkpointer> Connect(uint32_t rank) {
    return ConnectTo(NodeOf(rank), rank);
  }

  // The latest step committed at `tier`, asked of the first node that
  // answers (commits are the cluster's, whichever node is asked).
  std::optional<uint64_t> Latest(proto::Tier tier) {
    for (const Node& n : nodes_) {
      if (n.pid <= 0) continue;
      std::unique_ptr<Checkpointer> c = ConnectTo(n, 0);
      if (c == nullptr) continue;
      auto latest = c->LatestCommitted(tier);
      if (!latest.ok()) continue;
      if (!latest->has_value()) return std::nullopt;
      return **latest;
    }
    return std::nullopt;
  }

  // Whether the newest `n` steps committed at `tier` are all newer than
  // `after`.
  bool NewestAbove(proto::Tier tier, size_t n, uint64_t after) {
    std::unique_ptr<Checkpointer> c = Connect(0);
    if (c == nullptr) return false;
    auto listed = c->ListCommitted(tier);
    return listed.ok() && listed->size() >= n &&
           (*listed)[listed->size() - n] > after;
  }

  absl::Status InjectDisk(const Node& node, int write_errno, int fsync_errno) {
    auto stub = proto::CkptDaemon::NewStub(grpc::CreateChannel(
        "unix://" + node.socket(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    proto::InjectFaultsRequest req;
    req.set_write_errno(write_errno);
    req.set_fsync_errno(fsync_errno);
    proto::InjectFaultsResponse resp;
    grpc::Status s = stub->InjectFaults(&context, req, &resp);
    return s.ok() ? absl::OkStatus()
                  : absl::UnknownError(node.id +
                                       ": InjectFaults: " + s.error_message());
  }

  // Kills a node's daemon and the job (its ranks die with the node; the
  // others are restarted with them, as under torchrun). Returns the furthest
  // step the job had computed.
  uint64_t KillNode(Node& node) {
    KillAndReap(std::exchange(node.pid, -1));
    KillRanks();
    return Progress();
  }

  // --- faults -------------------------------------------------------------

  void InjectOne() {
    std::vector<std::string> kinds = {
        "kill_trainer", "kill_daemon", "kill_node", "stop_daemon",
        "disk_enospc",  "disk_eio",    "fsync_eio", "kill_during_gc"};
    if (multi()) {
      for (const char* k : {"lose_node", "stop_past_lease", "kill_etcd"}) {
        kinds.push_back(k);
      }
    }
    const std::string kind =
        kinds[std::uniform_int_distribution<size_t>(0, kinds.size() - 1)(rng_)];
    Node& node =
        nodes_[std::uniform_int_distribution<uint32_t>(0, o_.nodes - 1)(rng_)];
    report_.faults[kind]++;
    uint64_t before = Latest(proto::TIER_MEMORY).value_or(0);
    const Clock::time_point t0 = Clock::now();
    std::optional<uint64_t> resumed;
    uint64_t computed = 0;  // the furthest step the killed job had computed
    auto pause = [&](int lo, int hi) {
      SleepMs(std::uniform_int_distribution<int>(lo, hi)(rng_));
    };
    Log(absl::StrCat("fault ", kind, multi() ? " on " + node.id : "",
                     " (latest committed in memory: ", before, ")"));
    if (kind == "kill_trainer") {
      const uint32_t victim =
          std::uniform_int_distribution<uint32_t>(0, o_.ranks - 1)(rng_);
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
    } else if (kind == "stop_daemon") {
      ::kill(node.pid, SIGSTOP);
      pause(300, multi() ? 1000 * kLeaseTtlS - 500 : 1500);
      ::kill(node.pid, SIGCONT);
    } else if (kind == "stop_past_lease") {
      // Fenced: it can neither commit nor collect until it rejoined.
      ::kill(node.pid, SIGSTOP);
      pause(1000 * kLeaseTtlS + 500, 1000 * kLeaseTtlS + 2500);
      ::kill(node.pid, SIGCONT);
    } else if (kind == "kill_etcd") {
      etcd_->Kill();
      pause(100, 2000);
      if (!etcd_->Start()) {
        Violation("etcd did not start again; see " + etcd_->log_path());
        return;
      }
    } else if (kind == "kill_during_gc") {
      KillAndReap(std::exchange(node.pid, -1));
      const int nth = std::uniform_int_distribution<int>(1, 3)(rng_);
      if (!StartDaemon(
              node,
              absl::StrCat("CKPT_KILL_POINT=service.gc_after_catalog:", nth)))
        return;
      // It dies at the kill point; restart it normally either way.
      int status;
      for (int i = 0; i < 200 && !Exited(node.pid, &status); ++i) SleepMs(25);
      KillAndReap(std::exchange(node.pid, -1));
      if (!StartDaemon(node, "")) return;
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
      report_.steps_lost.push_back(computed > *resumed ? computed - *resumed
                                                       : 0);
    }
    // Recovered: a step newer than any before the fault is committed in
    // memory and on disk (training and persisting both resumed). After a
    // node's loss, every step retention promises at those tiers is newer: the
    // older ones may have been lost with the node.
    const bool lost = kind == "lose_node";
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(90);
    bool recovered = false;
    while (Clock::now() < deadline && !recovered) {
      recovered =
          NewestAbove(proto::TIER_MEMORY, lost ? kKeepMemory : 1, before) &&
          NewestAbove(proto::TIER_LOCAL_DISK, lost ? kKeepDisk : 1, before);
      if (!recovered) SleepMs(20);
    }
    if (!recovered) {
      Violation(absl::StrCat("no new step committed in memory and on disk ",
                             "within 90 s of ", kind, "; see ", o_.dir));
      return;
    }
    report_.recoveries++;
    report_.recover_s.push_back(SecondsSince(t0));
    CheckInvariants(kind);
  }

  // --- invariants ---------------------------------------------------------

  void CheckInvariants(const std::string& after) {
    const std::string when = "after " + after;
    std::vector<std::unique_ptr<Checkpointer>> ranks;
    std::vector<ckpt::demo::RankModel> models;
    std::vector<std::string> rng(o_.ranks);
    models.reserve(o_.ranks);
    for (uint32_t r = 0; r < o_.ranks; ++r) {
      ranks.push_back(Connect(r));
      models.emplace_back(r, o_.elements);
      if (ranks.back() == nullptr) {
        Violation(when + ": cannot connect to ckptd");
        return;
      }
      const int64_t global = o_.elements * o_.ranks;
      auto& m = models.back();
      absl::Status s =
          ranks[r]->RegisterTensor("model/w", proto::DTYPE_FLOAT32, m.w.data(),
                                   {global}, {m.offset}, {o_.elements});
      if (s.ok()) {
        s = ranks[r]->RegisterTensor("optim/momentum", proto::DTYPE_FLOAT32,
                                     m.m.data(), {global}, {m.offset},
                                     {o_.elements});
      }
      if (s.ok()) s = ranks[r]->RegisterBytes("rng", &rng[r]);
      if (!s.ok()) Violation(when + ": " + std::string(s.message()));
    }
    // Restores `step` on every rank: the bytes must be the expected ones.
    // Returns false if some rank could not restore it.
    // Restores `step` on every rank: the bytes must be the expected ones. A
    // failure is a violation when the step is `promised` at a tier: among the
    // newest `keep` commits there (re-checked after the failure, since the
    // job trains on and retention may drop the step in between).
    struct Promise {
      proto::Tier tier;
      size_t keep;
    };
    auto restores_exactly = [&](uint64_t step,
                                std::optional<Promise> promised) {
      for (uint32_t r = 0; r < o_.ranks; ++r) {
        absl::Status s = ranks[r]->Restore(step);
        if (!s.ok()) {
          if (promised.has_value() &&
              AmongNewest(ranks[0].get(), promised->tier, promised->keep,
                          step)) {
            Violation(absl::StrCat(when, ": step ", step, ", committed at ",
                                   proto::Tier_Name(promised->tier),
                                   " and kept, does not restore on rank ", r,
                                   ": ", s.message()));
          }
          return false;
        }
        models[r].SetRng(rng[r]);
        if (models[r].Serialize() != oracle_.Expected(r, step)) {
          Violation(absl::StrCat(when, ": step ", step, " rank ", r,
                                 " restored other bytes than the job saved"));
        }
      }
      ++checked_steps_;
      return true;
    };
    for (const auto& [tier, keep] : Promises()) {
      const std::string name = proto::Tier_Name(tier);
      auto listed = ranks[0]->ListCommitted(tier);
      if (!listed.ok()) {
        Violation(when + ": listing " + name + ": " +
                  std::string(listed.status().message()));
        continue;
      }
      if (listed->empty()) continue;
      const uint64_t newest = listed->back();
      uint64_t& seen = newest_seen_[tier];
      if (newest < seen) {
        Violation(absl::StrCat(when, ": the latest committed step at ", name,
                               " went backward from ", seen, " to ", newest));
      }
      seen = std::max(seen, newest);
      // Retention promises the newest `keep` commits; older records may
      // outlive their data.
      for (size_t i = 0; i < listed->size() && i < keep; ++i) {
        restores_exactly((*listed)[listed->size() - 1 - i],
                         Promise{tier, keep});
      }
      // A few older ones: if they restore, they must be exact.
      for (int i = 0; i < 3 && listed->size() > keep; ++i) {
        restores_exactly((*listed)[std::uniform_int_distribution<size_t>(
                             0, listed->size() - keep - 1)(check_rng_)],
                         std::nullopt);
      }
    }
    // A step beyond the newest committed one is in flight at best: restoring
    // it fails, unless it was committed in between, and then it is exact.
    restores_exactly(newest_seen_[proto::TIER_MEMORY] + 1, std::nullopt);
  }

  // True when `step` is among the newest `keep` steps committed at `tier`.
  bool AmongNewest(Checkpointer* c, proto::Tier tier, size_t keep,
                   uint64_t step) {
    auto listed = c->ListCommitted(tier);
    if (!listed.ok()) return true;  // cannot tell: count it
    auto it = std::find(listed->begin(), listed->end(), step);
    return it != listed->end() &&
           static_cast<size_t>(listed->end() - it) <= keep;
  }

  // --- the end ------------------------------------------------------------

  void Finish() {
    // Healthy again for the end: no fault pending.
    if (multi() && !etcd_->running() && !etcd_->Start()) return;
    for (Node& n : nodes_) {
      if (n.pid <= 0 && !StartDaemon(n, "")) return;
      (void)InjectDisk(n, 0, 0);
    }
    // Beyond every rank: one whose saves failed may be ahead of the commits.
    const uint64_t end =
        std::max(Latest(proto::TIER_MEMORY).value_or(0), Progress()) + 40;
    {
      std::ofstream(steps_file_ + ".tmp") << end << "\n";
      std::filesystem::rename(steps_file_ + ".tmp", steps_file_);
    }
    report_.final_step = end;
    Log(absl::StrCat("the job ends at step ", end));
    for (uint32_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r] <= 0) continue;
      int status = 0;
      const Clock::time_point deadline =
          Clock::now() + std::chrono::seconds(180);
      while (!Exited(ranks_[r], &status) && Clock::now() < deadline) {
        SleepMs(50);
      }
      if (Clock::now() >= deadline) {
        KillAndReap(ranks_[r]);
        Violation(absl::StrCat("rank ", r, " did not finish; see ", log_));
      } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        Violation(absl::StrCat("rank ", r, " ended with status ", status,
                               "; see ", log_));
      }
      ranks_[r] = -1;
    }
    for (uint32_t r = 0; r < o_.ranks; ++r) {
      std::ifstream in(absl::StrCat(o_.dir, "/out/final-rank-", r, ".bin"),
                       std::ios::binary);
      std::string got((std::istreambuf_iterator<char>(in)),
                      std::istreambuf_iterator<char>());
      if (got != oracle_.Expected(r, end)) {
        Violation(absl::StrCat("rank ", r,
                               " ended with another state than an "
                               "uninterrupted run of ",
                               end, " steps"));
      }
      std::ifstream stats(absl::StrCat(o_.dir, "/out/stats-rank-", r, ".txt"));
      uint64_t saves = 0;
      stats >> saves;
      report_.bytes_staged += saves * (o_.elements * 8 + 8);
    }
    CheckInvariants("the end");
    const auto latest_disk = Latest(proto::TIER_LOCAL_DISK);
    if (!latest_disk.has_value() || *latest_disk != end) {
      Violation(absl::StrCat("the last step ", end,
                             " is not the latest committed on disk"));
    }
  }

  int Print() {
    auto percentile = [](std::vector<double> v, double p) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
    };
    uint64_t lost_max = 0, lost_sum = 0;
    for (uint64_t l : report_.steps_lost) {
      lost_max = std::max(lost_max, l);
      lost_sum += l;
    }
    int injected = 0;
    for (const auto& [k, n] : report_.faults) injected += n;
    nlohmann::json j;
    j["seed"] = o_.seed;
    j["nodes"] = o_.nodes;
    j["ranks"] = o_.ranks;
    j["faults"] = report_.faults;
    j["faults_injected"] = injected;
    j["recoveries"] = report_.recoveries;
    j["recover_s_p50"] = percentile(report_.recover_s, 0.5);
    j["recover_s_p99"] = percentile(report_.recover_s, 0.99);
    j["steps_lost_max"] = lost_max;
    j["steps_lost_mean"] =
        report_.steps_lost.empty()
            ? 0.0
            : static_cast<double>(lost_sum) / report_.steps_lost.size();
    j["committed_steps_checked"] = checked_steps_;
    j["final_step"] = report_.final_step;
    j["bytes_staged"] = report_.bytes_staged;
    j["violations"] = report_.violations.size();
    j["violation_details"] = report_.violations;
    if (o_.json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf(
          "ckpt-chaos: seed %lu, %u node%s, %u ranks, %d faults injected\n",
          static_cast<unsigned long>(o_.seed), o_.nodes,
          o_.nodes == 1 ? "" : "s", o_.ranks, injected);
      for (const auto& [k, n] : report_.faults) {
        std::printf("  %-16s %d\n", k.c_str(), n);
      }
      std::printf(
          "  recoveries %d, time to recover p50 %.2f s, p99 %.2f s\n"
          "  steps recomputed per job restart: max %lu, mean %.2f\n"
          "  committed steps restored and compared: %lu; job ended at step "
          "%lu; %.1f MiB staged\n"
          "  invariant violations: %zu\n",
          report_.recoveries, percentile(report_.recover_s, 0.5),
          percentile(report_.recover_s, 0.99),
          static_cast<unsigned long>(lost_max),
          j["steps_lost_mean"].get<double>(),
          static_cast<unsigned long>(checked_steps_),
          static_cast<unsigned long>(report_.final_step),
          report_.bytes_staged / 1048576.0, report_.violations.size());
      for (const std::string& v : report_.violations) {
        std::printf("  VIOLATION: %s\n", v.c_str());
      }
      std::printf("  replay with --seed %lu; logs in %s\n",
                  static_cast<unsigned long>(o_.seed), log_.c_str());
    }
    return report_.violations.empty() ? 0 : 1;
  }

  void Violation(const std::string& what) {
    Log("VIOLATION: " + what);
    report_.violations.push_back(what);
  }
  void Log(const std::string& line) {
    std::ofstream(log_, std::ios::app) << "[ckpt-chaos] " << line << "\n";
  }

  const Options o_;
  std::mt19937_64 rng_;        // the fault schedule
  std::mt19937_64 check_rng_;  // which older steps are checked
  Oracle oracle_;
  const std::string log_, steps_file_;
  std::vector<Node> nodes_;
  std::unique_ptr<ckpt::tools::LocalEtcd> etcd_;  // several nodes
  std::vector<pid_t> ranks_;
  std::map<proto::Tier, uint64_t> newest_seen_;
  uint64_t checked_steps_ = 0;
  Report report_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ckpt-chaos: inject faults into a local cluster (ckptd, with --nodes "
      "also "
      "etcd) and its job, and prove "
      "that nothing committed is lost"};
  Options o;
  o.seed = std::random_device{}();
  o.ckptd = Sibling("../daemon/ckptd");
  o.trainer = Sibling("ckpt-demo-trainer");
  app.add_option("--dir", o.dir,
                 "working directory (default: a new temporary one)");
  app.add_option("--nodes", o.nodes,
                 "nodes (ckptd); more than 1: on a local etcd, with peer "
                 "replication and a shared tier")
      ->check(CLI::Range(1, 8));
  app.add_option("--ranks", o.ranks, "rank processes (rank r on node r % N)")
      ->check(CLI::Range(1, 16));
  app.add_option("--elements", o.elements,
                 "float32 elements per rank per tensor")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 26));
  app.add_option("--step-ms", o.step_ms,
                 "simulated compute per step (default 10 on one node, 50 on "
                 "several: each vote is then an etcd transaction)")
      ->check(CLI::Range(0, 10000));
  app.add_option("--seed", o.seed, "the fault schedule (printed)");
  app.add_option("--faults", o.faults, "faults to inject; 0: until --duration")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--duration", o.duration_s,
                 "stop injecting after this many seconds (0: no limit)")
      ->check(CLI::Range(0.0, 1e7));
  app.add_option("--memory-budget", o.memory_budget,
                 "each ckptd's staging memory budget, e.g. 512M; a small one "
                 "forces evictions of copies safe on disk")
      ->capture_default_str();
  app.add_flag("--json", o.json, "print the report as one JSON object");
  app.add_option("--ckptd", o.ckptd, "the daemon binary");
  app.add_option("--trainer", o.trainer, "the rank binary (ckpt-demo-trainer)");
  CLI11_PARSE(app, argc, argv);
  // libckpt's warnings about tiers it fell back from are expected here (the
  // harness restores steps the daemon is collecting); violations are reported.
  spdlog::set_level(spdlog::level::err);
  if (o.step_ms < 0) o.step_ms = o.nodes == 1 ? 10 : 50;
  if (o.faults == 0 && o.duration_s == 0) {
    std::fprintf(stderr, "ckpt-chaos: give --faults or --duration\n");
    return 2;
  }
  if (o.dir.empty()) {
    o.dir = (std::filesystem::temp_directory_path() /
             absl::StrCat("ckpt-chaos-", ::getpid()))
                .string();
  }
  std::filesystem::create_directories(o.dir);
  if (!o.json) {
    std::printf("ckpt-chaos: seed %lu, working directory %s\n",
                static_cast<unsigned long>(o.seed), o.dir.c_str());
    std::fflush(stdout);
  }
  return Chaos(o).Run();
}
