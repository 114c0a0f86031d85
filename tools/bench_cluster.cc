#include "tools/bench_cluster.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"

namespace ckpt::bench {

BenchCluster::BenchCluster(std::string dir, const std::string& name,
                           const std::vector<Spec>& nodes)
    : dir_(std::move(dir)), etcd_(dir_ + "/etcd") {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
  std::filesystem::create_directories(dir_);
  if (!etcd_.Start()) {
    error_ = "etcd did not start; see " + etcd_.log_path();
    return;
  }
  for (const Spec& spec : nodes) {
    BenchNode n;
    n.id = spec.id;
    n.dir = dir_ + "/" + n.id;
    n.staging =
        absl::StrCat("/dev/shm/ckpt-bench-", name, "-", ::getpid(), "-", n.id);
    std::vector<std::string> args = {
        tools::Sibling({"../daemon/ckptd", "ckptd"}),
        "--socket",
        n.socket(),
        "--data-dir",
        n.dir + "/data",
        "--staging-dir",
        n.staging,
        "--coordinator",
        "etcd://" + etcd_.endpoint(),
        "--lease-ttl",
        "2",
        "--node-id",
        n.id,
        "--peer-address",
        "127.0.0.1:0"};
    args.insert(args.end(), spec.args.begin(), spec.args.end());
    n.pid = tools::Spawn(args, n.dir + ".log");
    nodes_.push_back(n);
  }
  for (BenchNode& n : nodes_) {
    bool up = false;
    for (int i = 0; i < 400 && !up; ++i) {
      up = client::Checkpointer::Connect({"probe", 0, 1, n.socket()}).ok();
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    if (!up) error_ = n.id + " did not start; see " + n.dir + ".log";
  }
}

BenchCluster::~BenchCluster() {
  std::error_code ec;
  for (BenchNode& n : nodes_) {
    Kill(n);
    std::filesystem::remove_all(n.staging, ec);
    std::filesystem::remove_all(n.peer_dir(), ec);
    std::filesystem::remove_all(n.publish_dir(), ec);
  }
  etcd_.Kill();
}

void BenchCluster::Kill(BenchNode& n) {
  if (n.pid <= 0) return;
  ::kill(n.pid, SIGKILL);
  ::waitpid(n.pid, nullptr, 0);
  n.pid = -1;
}

void BenchCluster::Lose(BenchNode& n) {
  Kill(n);
  std::error_code ec;
  std::filesystem::remove_all(n.dir + "/data", ec);
  std::filesystem::remove_all(n.staging, ec);
  std::filesystem::remove_all(n.peer_dir(), ec);
}

}  // namespace ckpt::bench
