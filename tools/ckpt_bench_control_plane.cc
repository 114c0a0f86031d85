// ckpt-bench control-plane: the coordinators' votes and commits.

#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/coord/etcd_coordinator.h"
#include "nlohmann/json.hpp"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"
#include "tools/process.h"

namespace ckpt::bench {

using ckpt::tools::Seconds;

int RunControlPlane(const std::string& dir, std::string etcd, int ranks,
                    int nodes, int runs, bool json) {
  ckpt::tools::LocalEtcd local(dir + "/etcd");
  if (etcd.empty()) {
    if (!local.Start()) {
      std::cerr << "ckpt-bench: etcd did not start; see " << local.log_path()
                << "\n";
      return 1;
    }
    etcd = local.endpoint();
  }
  auto stop_etcd = [&] { local.Kill(); };
  std::vector<std::unique_ptr<ckpt::daemon::EtcdCoordinator>> coordinators;
  for (int n = 0; n < nodes; ++n) {
    absl::StatusOr<std::unique_ptr<ckpt::daemon::EtcdCoordinator>> c;
    for (int i = 0; i < 200; ++i) {
      c = ckpt::daemon::EtcdCoordinator::Connect(
          {.endpoints = {etcd},
           .node_id = absl::StrCat("bench-node-", n),
           .rpc_timeout = absl::Seconds(30)});
      if (c.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!c.ok()) {
      std::cerr << "ckpt-bench: etcd at " << etcd << ": " << c.status() << "\n";
      stop_etcd();
      return 1;
    }
    coordinators.push_back(*std::move(c));
  }
  const std::string job = absl::StrCat("bench-", ::getpid());
  std::vector<double> seconds;
  for (int run = 0; run < runs; ++run) {
    const uint64_t step = run + 1;
    std::atomic<bool> failed{false};
    auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> voters;
    for (int n = 0; n < nodes; ++n) {
      // A node's ranks vote together, as a ckptd's do when their shards
      // reach a tier at once (EtcdCoordinator::Vote batches them).
      voters.emplace_back([&, n] {
        std::vector<uint32_t> mine;
        for (int r = n; r < ranks; r += nodes) mine.push_back(r);
        auto done = coordinators[n]->VoteMany(job, step, mine, ranks,
                                              {ckpt::proto::TIER_MEMORY});
        if (!done.ok()) {
          std::cerr << "ckpt-bench: " << done.status() << "\n";
          failed = true;
        }
      });
    }
    for (auto& t : voters) t.join();
    seconds.push_back(Seconds(start));
    auto commit =
        coordinators[0]->GetCommit(job, step, ckpt::proto::TIER_MEMORY);
    if (failed || !commit.ok() || !commit->has_value()) {
      std::cerr << "ckpt-bench: step " << step << " was not committed\n";
      stop_etcd();
      return 1;
    }
  }
  coordinators.clear();
  stop_etcd();
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  nlohmann::json j;
  j["benchmark"] = "control-plane";
  j["ranks"] = ranks;
  j["nodes"] = nodes;
  j["runs"] = runs;
  j[absl::StrCat("commit_", ranks, "_ranks_s")] = median;
  j["commit_s_min"] = seconds.front();
  j["commit_s_max"] = seconds.back();
  j["votes_per_s"] = ranks / median;
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf(
        "%d ranks on %d nodes commit one step through etcd in %.3f s "
        "(median of %d; %.0f votes/s)\n",
        ranks, nodes, median, runs, ranks / median);
  }
  return 0;
}

}  // namespace ckpt::bench
