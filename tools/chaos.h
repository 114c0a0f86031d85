// ckpt-chaos (internal header of the harness): starts a local cluster (one
// ckptd with the fault-injecting file system and N rank processes of the
// deterministic demo model; or, with
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
//   - the job ends with the state of an uninterrupted run;
//   - ckptd counted the failures the faults make (ckpt_failures_total by
//     cause), and each node's goodput adds up to the job's wall time within
//     1%.
// Faults: SIGKILL of a rank (the job restarts), of a daemon, of a whole node
// (daemon and ranks); SIGSTOP of a daemon, then SIGCONT; SIGSTOP of a rank
// past ckptd's --trainer-hung-after (a hung trainer), then SIGCONT; disk faults
// switched on and off (ENOSPC and EIO on writes, EIO on fsync); a daemon killed
// in the middle of garbage collection; a power loss of a node (its processes
// and memory gone, its disks keeping only what was fsynced). With several nodes
// also: a node lost with its directories and replaced under its id (the job
// resumes from the peer tier), a daemon stopped past its etcd lease (fenced,
// then it rejoins), etcd killed and restarted, a daemon killed while it sends
// or receives a replica. With --object-store the shared tier is a bucket on a
// local S3 server (SeaweedFS) behind a fault proxy, and the faults include the
// server SIGKILLed and restarted, and bursts of its errors (500, 503, resets,
// slow answers, bodies damaged on the way). Exit 1 on any violation.
//
// The harness is one class, Chaos, whose parts live in: chaos.cc (the run),
// chaos_cluster.cc (daemons, ranks, etcd and what they are asked),
// chaos_faults.cc (the faults), chaos_invariants.cc (the checks),
// chaos_health.cc (ckptd's counts and goodput against the faults),
// chaos_report.cc (the report) and chaos_main.cc (the command line). One
// thread runs it all.
#ifndef CKPT_TOOLS_CHAOS_H_
#define CKPT_TOOLS_CHAOS_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/checkpointer.h"
#include "proto/daemon.grpc.pb.h"
#include "proto/daemon.pb.h"
#include "tools/demo_model.h"
#include "tools/fault_proxy.h"
#include "tools/local_s3.h"
#include "tools/metrics_text.h"
#include "tools/process.h"

namespace ckpt::chaos {

using ckpt::client::Checkpointer;
using Clock = std::chrono::steady_clock;
using ckpt::tools::Spawn;

inline constexpr char kJob[] = "chaos";
// The bucket of the shared tier with --object-store.
inline constexpr char kBucket[] = "ckpt-chaos";
// ckptd's retention in the harness's cluster.
inline constexpr size_t kKeepMemory = 2;
inline constexpr size_t kKeepDisk = 2;
inline constexpr size_t kKeepShared = 2;

double SecondsSince(Clock::time_point t);
void SleepMs(int64_t ms);
// True once `pid` has exited (reaped); `status` gets its wait status.
bool Exited(pid_t pid, int* status);
void KillAndReap(pid_t pid);

struct Node;
// A stub for `node`'s ckptd, the call's deadline (10 s) set in `context`.
std::unique_ptr<proto::CkptDaemon::Stub> DaemonStub(
    const Node& node, grpc::ClientContext* context);
// `node`'s ckptd's metrics.
absl::StatusOr<std::vector<ckpt::tools::Sample>> Scrape(const Node& node);

// The state the harness expects of each rank after each step: the demo model
// run from scratch, outside the system.
class Oracle {
 public:
  explicit Oracle(int64_t elements) : elements_(elements) {}
  std::string Expected(uint32_t rank, uint64_t step);

 private:
  const int64_t elements_;
  std::map<uint32_t, std::pair<uint64_t, ckpt::demo::RankModel>> cache_;
};

struct Options {
  std::string dir;
  uint32_t nodes = 1;
  uint32_t ranks = 2;
  int64_t elements = 16384;
  int step_ms = -1;  // default: 10 ms on one node, 150 ms on several
  uint64_t seed = 0;
  int faults = 30;
  double duration_s = 0;
  bool json = false;
  // Each ckptd's --memory-budget: a small one makes every save evict
  // copies that are safe on disk.
  std::string memory_budget = "512M";
  // With several nodes, the peer tier: one replica per shard, or this
  // erasure code ("rs:K+M", --peer-redundancy).
  std::string peer_redundancy;
  // The fault kinds to draw from; empty: every kind the cluster can take.
  std::vector<std::string> kinds;
  std::string ckptd, trainer;
  // tools/ckpt-certs: the cluster's etcd runs with TLS and auth.
  std::string certs_tool;
  // With several nodes: the shared tier in a bucket of a local S3 server
  // reached through a fault proxy, instead of a directory.
  bool object_store = false;
};

struct Report {
  std::map<std::string, int> faults;
  int recoveries = 0;
  int kill_points_reached = 0;  // of the daemons restarted to die at one
  std::vector<double> recover_s;
  std::vector<uint64_t> steps_lost;
  uint64_t bytes_staged = 0;
  uint64_t final_step = 0;
  std::vector<std::string> violations;
  // What ckptd counted (ckpt_failures_total, summed over the nodes) and
  // expected from the faults injected, by cause: "n" or "lo..hi" (several
  // nodes: the causes a node sees alone).
  std::map<std::string, double> failures_counted;
  // Faults that left a node serving ranks of the job without its etcd lease
  // (stop_past_lease seen to end in a rejoin): each a node_lost.
  int leases_expired = 0;
  std::map<std::string, std::string> failures_expected;
  // Each node's goodput split of the job (seconds; "ettr") beside the wall
  // time the harness measured from its ranks' start to their end.
  std::map<std::string, std::map<std::string, double>> goodput;
  double wall_s = 0;
};

// One node of the cluster: a ckptd with its directories (and, with several
// nodes, its peer service), and the ranks placed on it.
struct Node {
  std::string id;
  std::string dir;      // data directory, socket, log
  std::string staging;  // tmpfs: the memory tier
  pid_t pid = -1;
  // The last StartDaemon with an environment (a kill point) saw that
  // daemon die during its start and started it again without.
  bool died_at_start = false;
  std::string socket() const { return dir + "/run/ckptd.sock"; }
  std::string data() const { return dir + "/data"; }
  std::string log() const { return dir + "/ckptd.log"; }
  std::string replicas() const { return staging + ".peer"; }
};

class Chaos {
 public:
  explicit Chaos(const Options& o);
  ~Chaos();

  int Run();

  // The fault kinds a cluster of one or several nodes, its shared tier on an
  // object store or not, can take (--kinds picks among them).
  static std::vector<std::string> Kinds(bool several_nodes, bool object_store);

 private:
  // The lease of each ckptd on etcd: a daemon stopped longer is fenced.
  static constexpr int kLeaseTtlS = 2;
  // ckptd's --trainer-hung-after: a rank stopped longer hangs.
  static constexpr int kHungAfterS = 2;
  // Every this many steps also go to the shared tier (several nodes).
  static constexpr int kSharedEvery = 4;

  bool multi() const { return o_.nodes > 1; }
  Node& NodeOf(uint32_t rank) { return nodes_[rank % o_.nodes]; }
  // The tiers whose commits the harness checks, and how many of the newest
  // commits at each retention keeps restorable. At the peer tier that is the
  // newest one only: a node's loss takes the replicas it held, and a replica's
  // owner keeps its own copy for the newest peer-committed step.
  std::vector<std::pair<proto::Tier, size_t>> Promises() const;

  // --- the cluster --------------------------------------------------------

  bool StartDaemon(Node& node, const std::string& env);
  // ckptd's flags for the shared tier: a directory, or the bucket.
  std::vector<std::string> SharedTierArgs() const;
  // --object-store: starts the S3 server and its fault proxy, and makes the
  // bucket; false (with a violation) if it cannot.
  bool StartObjectStore();

  // Starts the job's ranks, resuming from the latest step committed at
  // `resume` (the orchestrator's choice: peer after a node was lost).
  void StartRanks(proto::Tier resume);

  std::string ProgressFile(uint32_t rank) const;
  // The furthest step any rank has computed.
  uint64_t Progress() const;

  // Kills every rank, then waits until the daemon has handled what they sent
  // before they died (a commit may still land just after): a restarted job's
  // ranks must all see the same latest step, as an orchestrator's restart
  // delay ensures.
  void KillRanks();

  // A daemon that died on its own (no fault killed it) is a violation: it is
  // reported with its signal or exit code, and started again.
  void ReapDeadDaemons();

  // Lets the job train for `ms`; false (with a violation) if a rank died.
  bool Train(int ms);

  // The harness's own checkpointers only read (the trainers are processes):
  // their restores never withdraw a trainer's shards.
  std::unique_ptr<Checkpointer> ConnectTo(const Node& node, uint32_t rank);
  std::unique_ptr<Checkpointer> Connect(uint32_t rank);

  // The latest step committed at `tier`, asked of the first node that
  // answers (commits are the cluster's, whichever node is asked).
  std::optional<uint64_t> Latest(proto::Tier tier);

  // Whether the newest `n` steps committed at `tier` are all newer than
  // `after`.
  bool NewestAbove(proto::Tier tier, size_t n, uint64_t after);

  absl::Status InjectDisk(const Node& node, int write_errno, int fsync_errno);
  // Cuts the node's power in its ckptd (every later write fails) and writes
  // the plan of what the loss takes to PowerLossPlan(node).
  absl::Status CutPower(const Node& node);
  std::string PowerLossPlan(const Node& node) const {
    return node.dir + "/power-loss-plan";
  }

  // Kills a node's daemon and the job (its ranks die with the node; the
  // others are restarted with them, as under torchrun). Returns the furthest
  // step the job had computed.
  uint64_t KillNode(Node& node);

  // --- faults -------------------------------------------------------------

  void InjectOne();
  // A node's power loss: its ckptd and the job's ranks die at once, its
  // memory (staging and replica tmpfs) is gone, and its disks keep only what
  // was fsynced. It restarts; everything committed on disk must still
  // restore. Returns the furthest step the job had computed.
  uint64_t PowerLoss(Node& node);
  // A ckptd restarted to die at `kill_point` (name:nth), then restarted.
  bool KillAt(Node& node, const std::string& kill_point);
  // kill_object_store: the S3 server SIGKILLed (mid-upload, when one is in
  // flight) and restarted on its data; object_store_errors: the proxy's
  // faults armed for the next requests.
  void ObjectStoreFault(const std::string& kind);

  // --- invariants ---------------------------------------------------------

  void CheckInvariants(const std::string& after) {
    CheckInvariants(after, Promises());
  }
  // The checks above at the given tiers only.
  void CheckInvariants(const std::string& after,
                       const std::vector<std::pair<proto::Tier, size_t>>& at);

  // True when `step` is among the newest `keep` steps committed at `tier`.
  bool AmongNewest(Checkpointer* c, proto::Tier tier, size_t keep,
                   uint64_t step);

  // --- the end ------------------------------------------------------------

  void Finish();
  // ckptd's failure counts and goodput (tools/chaos_health.cc) against the
  // faults injected and the job's wall time: a violation when they disagree.
  void CheckHealth();
  // Waits (up to 15 s) until every rank on `node` has its session with the
  // node's ckptd (after a restart they attach again): a trainer fault
  // ckptd cannot see is not one it can count.
  void AwaitSessions(const Node& node, uint32_t victim);
  // The times `node`'s ckptd rejoined etcd after its lease expired (0 when
  // it cannot be asked).
  double Rejoins(const Node& node);
  // The node_lost failures of the job every ckptd counted, summed.
  double NodeLostCounted();
  // stop_past_lease of `node`, which serves ranks of the job: if its lease
  // expired (it rejoined etcd), another ckptd counted a node_lost (a
  // violation if not within 3 s).
  void CheckLeaseLossCounted(const Node& node, double rejoins_before,
                             double lost_before);
  // Why rank `rank` ended with another state than the reference: the first
  // of its resumes whose logged state differs from the reference's, if any.
  std::string ExplainResumes(uint32_t rank);

  int Print();

  void Violation(const std::string& what);
  void Log(const std::string& line);

  const Options o_;
  std::mt19937_64 rng_;        // the fault schedule
  std::mt19937_64 check_rng_;  // which older steps are checked
  Oracle oracle_;
  const std::string log_, steps_file_;
  const Clock::time_point started_ = Clock::now();  // for the log's times
  std::vector<Node> nodes_;
  std::unique_ptr<ckpt::tools::LocalEtcd> etcd_;  // several nodes
  std::unique_ptr<ckpt::tools::LocalS3> s3_;      // --object-store
  std::unique_ptr<ckpt::tools::FaultProxy> proxy_;
  std::vector<pid_t> ranks_;
  Clock::time_point job_started_, job_ended_;  // the first ranks to the last
  std::set<std::string> lost_nodes_;  // lose_node: their figures began anew
  // Hangs injected per node of the victim since it was last lost, and
  // those whose counts a lost node took with it.
  std::map<std::string, int> hangs_on_node_;
  int hangs_forgotten_ = 0;
  std::map<proto::Tier, uint64_t> newest_seen_;
  uint64_t checked_steps_ = 0;
  Report report_;
};

}  // namespace ckpt::chaos

#endif  // CKPT_TOOLS_CHAOS_H_
