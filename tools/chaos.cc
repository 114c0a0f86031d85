#include "tools/chaos.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ckpt::chaos {

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void SleepMs(int64_t ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

bool Exited(pid_t pid, int* status) {
  return ::waitpid(pid, status, WNOHANG) == pid;
}

void KillAndReap(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

std::string Oracle::Expected(uint32_t rank, uint64_t step) {
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

Chaos::Chaos(const Options& o)
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
    etcd_ = std::make_unique<ckpt::tools::LocalEtcd>(
        o.dir + "/etcd", ckpt::tools::LocalEtcd::Secured{o.certs_tool});
}

Chaos::~Chaos() {
  for (pid_t& p : ranks_) KillAndReap(std::exchange(p, -1));
  std::error_code ec;
  for (Node& n : nodes_) {
    if (n.pid > 0) ::kill(n.pid, SIGCONT);
    KillAndReap(std::exchange(n.pid, -1));
    std::filesystem::remove_all(n.staging, ec);
    std::filesystem::remove_all(n.replicas(), ec);
  }
}

int Chaos::Run() {
  std::filesystem::create_directories(o_.dir + "/out");
  std::filesystem::remove(steps_file_);
  if (multi() && !etcd_->Start()) {
    Violation("etcd did not start; see " + etcd_->log_path());
    return Print();
  }
  if (o_.object_store && !StartObjectStore()) return Print();
  for (Node& n : nodes_) {
    if (!StartDaemon(n, "")) return Print();
  }
  job_started_ = Clock::now();
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

void Chaos::Violation(const std::string& what) {
  Log("VIOLATION: " + what);
  report_.violations.push_back(what);
}

void Chaos::Log(const std::string& line) {
  char elapsed[32];
  std::snprintf(elapsed, sizeof elapsed, "%.1f", SecondsSince(started_));
  std::ofstream(log_, std::ios::app)
      << "[ckpt-chaos +" << elapsed << " s] " << line << "\n";
}

}  // namespace ckpt::chaos
