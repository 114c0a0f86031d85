// Part of ckpt-chaos: see tools/chaos.h.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "io/host.h"
#include "io/s3/s3_client.h"
#include "proto/daemon.grpc.pb.h"
#include "tools/chaos.h"

namespace ckpt::chaos {

bool Chaos::StartDaemon(Node& node, const std::string& env) {
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
                                   "--trainer-hung-after",
                                   std::to_string(kHungAfterS),
                                   "--fault-injection"};
  if (multi()) {
    for (const std::string& a : etcd_->DaemonArgs()) args.push_back(a);
    for (const std::string& a :
         {std::string("--lease-ttl"), std::to_string(kLeaseTtlS),
          std::string("--node-id"), node.id, std::string("--failure-domain"),
          node.id, std::string("--peer-address"), std::string("127.0.0.1:0"),
          // Kills come faster than real failures: re-protection at once.
          std::string("--reprotect-delay"), std::string("0"),
          o_.peer_redundancy.empty() ? std::string("--peer-replicas")
                                     : std::string("--peer-redundancy"),
          o_.peer_redundancy.empty() ? std::string("1") : o_.peer_redundancy,
          std::string("--shared-every"), std::to_string(kSharedEvery),
          std::string("--keep-shared"), std::to_string(kKeepShared)}) {
      args.push_back(a);
    }
    for (const std::string& a : SharedTierArgs()) args.push_back(a);
  }
  std::error_code ec;
  std::filesystem::create_directories(node.dir, ec);
  node.pid = Spawn(args, node.log(), env);
  node.died_at_start = false;
  for (int i = 0; i < 400; ++i) {
    int status;
    if (Exited(node.pid, &status)) {
      node.pid = -1;
      // A kill point may fire during start-up recovery (GC runs then too).
      if (!env.empty()) {
        const bool started = StartDaemon(node, "");
        node.died_at_start = true;
        return started;
      }
      Violation(absl::StrCat(node.id, "'s ckptd exited at start (wait status ",
                             status, "); see ", node.log()));
      return false;
    }
    if (ConnectTo(node, 0) != nullptr) return true;
    SleepMs(25);
  }
  Violation(node.id + "'s ckptd did not start listening; see " + node.log());
  return false;
}

std::vector<std::string> Chaos::SharedTierArgs() const {
  if (!o_.object_store) return {"--shared-dir", o_.dir + "/shared"};
  return {"--shared-uri",          absl::StrCat("s3://", kBucket, "/shared"),
          "--s3-endpoint",         proxy_->endpoint(),
          "--s3-credentials-file", o_.dir + "/s3-credentials",
          "--s3-part-mib",         "5"};
}

bool Chaos::StartObjectStore() {
  s3_ = std::make_unique<ckpt::tools::LocalS3>(o_.dir + "/s3");
  if (!s3_->Start()) {
    Violation("the S3 server did not start; see " + s3_->log_path() +
              (ckpt::tools::LocalS3::Binary().empty()
                   ? " (no weed binary: tools/torch-venv.sh installs it)"
                   : ""));
    return false;
  }
  const std::string endpoint = s3_->endpoint();
  proxy_ = std::make_unique<ckpt::tools::FaultProxy>(
      std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
  if (!proxy_->Start()) {
    Violation("the fault proxy found no port to listen on");
    return false;
  }
  std::ofstream(o_.dir + "/s3-credentials")
      << "[default]\naws_access_key_id = " << s3_->access_key()
      << "\naws_secret_access_key = " << s3_->secret_key() << "\n";
  ckpt::io::s3::S3Options options;
  options.endpoint = endpoint;
  options.credentials = {s3_->access_key(), s3_->secret_key()};
  absl::StatusOr<std::unique_ptr<ckpt::io::s3::S3Client>> client =
      ckpt::io::s3::S3Client::Create(std::move(options));
  absl::Status made =
      client.ok() ? (*client)->CreateBucket(kBucket) : client.status();
  if (!made.ok()) {
    Violation(absl::StrCat("the bucket: ", made.message()));
    return false;
  }
  return true;
}

void Chaos::StartRanks(proto::Tier resume) {
  const std::string tier = resume == proto::TIER_PEER         ? "peer"
                           : resume == proto::TIER_LOCAL_DISK ? "disk"
                                                              : "memory";
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

std::string Chaos::ProgressFile(uint32_t rank) const {
  return absl::StrCat(o_.dir, "/out/progress-rank-", rank);
}

uint64_t Chaos::Progress() const {
  uint64_t furthest = 0;
  for (uint32_t r = 0; r < o_.ranks; ++r) {
    uint64_t step = 0;
    std::ifstream(ProgressFile(r)) >> step;
    furthest = std::max(furthest, step);
  }
  return furthest;
}

void Chaos::KillRanks() {
  for (pid_t& p : ranks_) KillAndReap(std::exchange(p, -1));
  std::optional<uint64_t> last = Latest(proto::TIER_MEMORY);
  for (int stable = 0, i = 0; stable < 5 && i < 200; ++i) {
    SleepMs(50);
    std::optional<uint64_t> now = Latest(proto::TIER_MEMORY);
    stable = now == last ? stable + 1 : 0;
    last = now;
  }
}

void Chaos::ReapDeadDaemons() {
  for (Node& node : nodes_) {
    int status = 0;
    if (node.pid <= 0 || !Exited(node.pid, &status)) continue;
    node.pid = -1;
    Violation(absl::StrCat(
        node.id, "'s ckptd died on its own (",
        WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status), ", ",
                                           strsignal(WTERMSIG(status)))
                            : absl::StrCat("exit code ", WEXITSTATUS(status)),
        "); see ", node.log()));
    StartDaemon(node, "");
  }
}

bool Chaos::Train(int ms) {
  const Clock::time_point until = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < until) {
    ReapDeadDaemons();
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

std::unique_ptr<Checkpointer> Chaos::ConnectTo(const Node& node,
                                               uint32_t rank) {
  auto c = Checkpointer::Connect({.job = kJob,
                                  .rank = rank,
                                  .world_size = o_.ranks,
                                  .socket_path = node.socket(),
                                  .rpc_timeout = absl::Seconds(5),
                                  .read_only = true});
  return c.ok() ? *std::move(c) : nullptr;
}

std::unique_ptr<Checkpointer> Chaos::Connect(uint32_t rank) {
  return ConnectTo(NodeOf(rank), rank);
}

std::optional<uint64_t> Chaos::Latest(proto::Tier tier) {
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

bool Chaos::NewestAbove(proto::Tier tier, size_t n, uint64_t after) {
  std::unique_ptr<Checkpointer> c = Connect(0);
  if (c == nullptr) return false;
  // The latest step first (one record): the whole list only once it is newer.
  auto latest = c->LatestCommitted(tier);
  if (!latest.ok() || !latest->has_value() || **latest <= after) return false;
  if (n <= 1) return true;
  auto listed = c->ListCommitted(tier);
  return listed.ok() && listed->size() >= n &&
         (*listed)[listed->size() - n] > after;
}

std::unique_ptr<proto::CkptDaemon::Stub> DaemonStub(
    const Node& node, grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(10));
  return proto::CkptDaemon::NewStub(
      grpc::CreateChannel(ckpt::io::UnixSocketTarget(node.socket()),
                          grpc::InsecureChannelCredentials()));
}

namespace {

absl::Status InjectFaults(const Node& node,
                          const proto::InjectFaultsRequest& req) {
  grpc::ClientContext context;
  auto stub = DaemonStub(node, &context);
  proto::InjectFaultsResponse resp;
  grpc::Status s = stub->InjectFaults(&context, req, &resp);
  return s.ok() ? absl::OkStatus()
                : absl::UnknownError(node.id +
                                     ": InjectFaults: " + s.error_message());
}

}  // namespace

absl::Status Chaos::InjectDisk(const Node& node, int write_errno,
                               int fsync_errno) {
  proto::InjectFaultsRequest req;
  req.set_write_errno(write_errno);
  req.set_fsync_errno(fsync_errno);
  return InjectFaults(node, req);
}

absl::Status Chaos::CutPower(const Node& node) {
  proto::InjectFaultsRequest req;
  req.set_power_loss_plan(PowerLossPlan(node));
  return InjectFaults(node, req);
}

uint64_t Chaos::KillNode(Node& node) {
  KillAndReap(std::exchange(node.pid, -1));
  KillRanks();
  return Progress();
}

}  // namespace ckpt::chaos
