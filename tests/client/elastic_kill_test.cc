// Elastic restart on four nodes (four ckptd on loopback with their own
// directories, ports and node ids, a real etcd, peer replication K = 1), two
// rank processes each. One whole node (its daemon and its ranks) is SIGKILLed
// mid-training: the survivors are told within the lease TTL, rejoin at world
// size 6 without restarting their processes, restore the newest step committed
// at tier peer from their own copies and from the replicas of the dead node's
// shards, and go on. A replacement node then joins: the job grows back to
// world size 8 and reshards again. The final state is bit-identical to a
// reference computed without any failure (the update is elementwise, so the
// reference does not depend on the sharding).
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"
#include "tests/client/elastic_model.h"
#include "tests/daemon/etcd_process.h"
#include "tests/test_util.h"
#include "tools/process.h"

namespace ckpt::client {
namespace {

constexpr int64_t kGlobal = 60007;  // uneven over 6 and 8 ranks
// The job trains to 40 iterations, loses a node, goes on to 80, grows back and
// ends at 120: the test paces it through a file the ranks read.
constexpr uint64_t kIterations = 120;
constexpr uint64_t kEpochStride = 1000000;

struct RankProcess {
  std::string participant, out;
  pid_t pid = -1;
};

class Cluster {
 public:
  Cluster() { EXPECT_TRUE(etcd_.Start()) << etcd_.log(); }
  ~Cluster() {
    for (auto& [id, r] : ranks_) {
      if (r.pid > 0) {
        ::kill(r.pid, SIGKILL);
        ::waitpid(r.pid, nullptr, 0);
      }
    }
  }

  testing::DaemonProcess* AddNode(const std::string& id) {
    std::vector<std::string> args = etcd_.DaemonArgs();
    args.insert(args.end(),
                {"--lease-ttl", "2", "--node-id", id, "--peer-address",
                 "127.0.0.1:0", "--peer-replicas", "1"});
    auto node = std::make_unique<testing::DaemonProcess>(args);
    EXPECT_TRUE(node->Start()) << node->log();
    nodes_[id] = std::move(node);
    return nodes_[id].get();
  }

  void StartRank(const std::string& node, const std::string& participant,
                 int first_min) {
    RankProcess r;
    r.participant = participant;
    r.out = dir_.File(participant + ".out");
    r.pid = tools::Spawn({ELASTIC_TRAINER, nodes_[node]->socket(), "grow",
                          participant, std::to_string(kGlobal),
                          dir_.File("limit"), std::to_string(first_min), r.out},
                         dir_.File(participant + ".log"));
    ranks_[participant] = r;
  }

  // The iteration the ranks train up to.
  void SetLimit(uint64_t limit) {
    testing::WriteAll(dir_.File("limit.new"), std::to_string(limit));
    std::filesystem::rename(dir_.File("limit.new"), dir_.File("limit"));
  }

  void KillRank(const std::string& participant) {
    RankProcess& r = ranks_[participant];
    ::kill(r.pid, SIGKILL);
    ::waitpid(r.pid, nullptr, 0);
    r.pid = -1;
    ranks_.erase(participant);
  }

  void Signal(int sig) {
    for (auto& [id, r] : ranks_) ::kill(r.pid, sig);
  }

  // The last status line of every live rank.
  std::map<std::string, std::string> Status() const {
    std::map<std::string, std::string> out;
    for (const auto& [id, r] : ranks_) {
      std::ifstream in(r.out + ".status");
      std::string line, last;
      while (std::getline(in, line)) last = line;
      out[id] = last;
    }
    return out;
  }

  // Waits until every live rank's last epoch has world size `world`.
  bool AllAtWorld(uint32_t world, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    const std::string want = absl::StrCat(" world ", world, " ");
    while (absl::Now() < deadline) {
      bool all = true;
      for (const auto& [id, line] : Status()) {
        all = all && line.find(want) != std::string::npos;
      }
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // The newest step committed at tier peer, as seen through node `via`.
  uint64_t LatestOnPeers(const std::string& via) {
    auto c = Checkpointer::Connect({"grow", 0, 1, nodes_[via]->socket()});
    if (!c.ok()) return 0;
    auto latest = (*c)->LatestCommitted(proto::TIER_PEER);
    return latest.ok() && latest->has_value() ? **latest : 0;
  }

  // Waits until a step of `epoch` is committed at tier peer.
  bool EpochOnPeers(uint64_t epoch, const std::string& via,
                    absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      if (LatestOnPeers(via) / kEpochStride >= epoch) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  std::string StatusText() const {
    std::string out;
    for (const auto& [id, line] : Status()) out += id + ": " + line + "\n";
    return out;
  }

  std::string Logs() const {
    std::string out;
    for (const auto& [id, r] : ranks_) {
      out += "--- " + id + "\n" + testing::ReadAll(dir_.File(id + ".log"));
    }
    return out;
  }

  std::map<std::string, std::unique_ptr<testing::DaemonProcess>> nodes_;
  std::map<std::string, RankProcess> ranks_;

 private:
  testing::TempDir dir_;
  testing::EtcdProcess etcd_;
};

TEST(ElasticKillTest, ANodeDiesTheJobShrinksToSixThenGrowsBackToEight) {
  Cluster cluster;
  cluster.SetLimit(kIterations / 3);
  for (const char* node : {"node-a", "node-b", "node-c", "node-d"}) {
    ASSERT_TRUE(cluster.AddNode(node) != nullptr);
  }
  for (const char* node : {"node-a", "node-b", "node-c", "node-d"}) {
    for (int i = 0; i < 2; ++i) {
      cluster.StartRank(node, absl::StrCat(node, "-r", i), 8);
    }
  }
  ASSERT_TRUE(cluster.AllAtWorld(8, absl::Seconds(60))) << cluster.Logs();
  // Training goes on until a step of epoch 1 is safe on the peers.
  ASSERT_TRUE(cluster.EpochOnPeers(1, "node-a", absl::Seconds(60)))
      << cluster.Logs() << cluster.nodes_["node-a"]->log();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));

  // Node d dies whole: its ranks and its daemon, at once.
  const auto killed = std::chrono::steady_clock::now();
  cluster.KillRank("node-d-r0");
  cluster.KillRank("node-d-r1");
  cluster.nodes_["node-d"]->Kill();
  ASSERT_TRUE(cluster.AllAtWorld(6, absl::Seconds(60)))
      << cluster.Logs() << cluster.StatusText();
  std::cout << "the six survivors rejoined "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             killed)
                   .count()
            << " s after the kill (lease TTL 2 s)\n";
  for (const auto& [id, line] : cluster.Status()) {
    EXPECT_THAT(line, ::testing::Not(::testing::HasSubstr("restored 0 ")))
        << id << " did not restore a step";
  }
  cluster.SetLimit(kIterations * 2 / 3);
  // A step of the world of six is safe on the peers before the job grows.
  ASSERT_TRUE(cluster.EpochOnPeers(2, "node-a", absl::Seconds(60)))
      << cluster.Logs() << cluster.StatusText() << "--- node-a\n"
      << cluster.nodes_["node-a"]->log();

  // A replacement node joins; the survivors are asked to rejoin too.
  ASSERT_TRUE(cluster.AddNode("node-e") != nullptr);
  cluster.StartRank("node-e", "node-e-r0", 8);
  cluster.StartRank("node-e", "node-e-r1", 8);
  for (auto& [id, r] : cluster.ranks_) {
    if (id.rfind("node-e", 0) != 0) ::kill(r.pid, SIGUSR1);
  }
  ASSERT_TRUE(cluster.AllAtWorld(8, absl::Seconds(60)))
      << cluster.Logs() << cluster.StatusText() << "--- node-e\n"
      << cluster.nodes_["node-e"]->log();
  for (const auto& [id, line] : cluster.Status()) {
    EXPECT_THAT(line, ::testing::Not(::testing::HasSubstr("restored 0 ")))
        << id << " did not restore a step";
  }

  cluster.SetLimit(kIterations);
  // Every rank finishes its iterations and writes its box.
  cluster.Signal(SIGUSR2);
  std::vector<float> state(kGlobal, -1.0f);
  int64_t covered = 0;
  for (auto& [id, r] : cluster.ranks_) {
    int status = 0;
    ASSERT_EQ(::waitpid(r.pid, &status, 0), r.pid);
    r.pid = -1;
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << id << " exited with " << status << "\n"
        << cluster.Logs();
    std::ifstream in(r.out, std::ios::binary);
    int64_t offset = 0, length = 0;
    in >> offset >> length;
    in.get();
    ASSERT_TRUE(in.good() && offset >= 0 && offset + length <= kGlobal);
    in.read(reinterpret_cast<char*>(state.data() + offset),
            static_cast<std::streamsize>(length * sizeof(float)));
    ASSERT_TRUE(in.good()) << id;
    covered += length;
  }
  EXPECT_EQ(covered, kGlobal);
  // The reference: the same iterations without any failure.
  int64_t differ = 0;
  for (int64_t g = 0; g < kGlobal; ++g) {
    float x = testing::ElasticInitial(g);
    for (uint64_t it = 1; it <= kIterations; ++it)
      x = testing::ElasticStep(x, it, g);
    if (std::memcmp(&x, &state[g], sizeof x) != 0) ++differ;
  }
  EXPECT_EQ(differ, 0) << "elements differ from the reference";
}

}  // namespace
}  // namespace ckpt::client
