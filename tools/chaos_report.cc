// Part of ckpt-chaos: see tools/chaos.h.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/daemon.grpc.pb.h"
#include "tools/chaos.h"

namespace ckpt::chaos {

int Chaos::Print() {
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
  j["kill_points_reached"] = report_.kill_points_reached;
  j["recover_s"] = report_.recover_s;
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
  j["failures_counted"] = report_.failures_counted;
  j["failures_expected"] = report_.failures_expected;
  j["goodput"] = report_.goodput;
  j["wall_s"] = report_.wall_s;
  j["violations"] = report_.violations.size();
  j["violation_details"] = report_.violations;
  if (o_.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "ckpt-chaos: seed %lu, %u node%s, %u ranks, %d faults injected\n",
        static_cast<unsigned long>(o_.seed), o_.nodes, o_.nodes == 1 ? "" : "s",
        o_.ranks, injected);
    for (const auto& [k, n] : report_.faults) {
      std::printf("  %-24s %d\n", k.c_str(), n);
    }
    std::printf(
        "  recoveries %d, time to recover p50 %.2f s, p99 %.2f s; kill "
        "points reached %d\n"
        "  steps recomputed per job restart: max %lu, mean %.2f\n"
        "  committed steps restored and compared: %lu; job ended at step "
        "%lu; %.1f MiB staged\n"
        "  invariant violations: %zu\n",
        report_.recoveries, percentile(report_.recover_s, 0.5),
        percentile(report_.recover_s, 0.99), report_.kill_points_reached,
        static_cast<unsigned long>(lost_max),
        j["steps_lost_mean"].get<double>(),
        static_cast<unsigned long>(checked_steps_),
        static_cast<unsigned long>(report_.final_step),
        report_.bytes_staged / 1048576.0, report_.violations.size());
    std::printf("  ckptd counted (expected from the faults):");
    for (const auto& [cause, n] : report_.failures_counted) {
      auto e = report_.failures_expected.find(cause);
      if (n == 0 && e == report_.failures_expected.end()) continue;
      std::printf(
          " %s %.0f (%s)", cause.c_str(), n,
          e == report_.failures_expected.end() ? "-" : e->second.c_str());
    }
    std::printf("\n");
    for (const auto& [node, g] : report_.goodput) {
      std::printf(
          "  goodput %s: %.1f s of the job's %.1f s, ETTR %.3f (training "
          "%.1f, stall %.1f, recovery %.1f, lost %.1f)\n",
          node.c_str(), g.at("wall"), report_.wall_s, g.at("ettr"),
          g.at("training"), g.at("stall"), g.at("recovery"), g.at("lost"));
    }
    for (const std::string& v : report_.violations) {
      std::printf("  VIOLATION: %s\n", v.c_str());
    }
    std::printf("  replay with --seed %lu; logs in %s\n",
                static_cast<unsigned long>(o_.seed), log_.c_str());
  }
  return report_.violations.empty() ? 0 : 1;
}

}  // namespace ckpt::chaos
