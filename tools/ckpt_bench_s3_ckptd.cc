// ckpt-bench io --shared-uri s3://...: ckptd's own restore from the bucket,
// end to end. Node a (--shared-uri, no peer replicas, chunks stored raw)
// saves a step of one rank's state and waits until it is committed at the
// shared tier; node a is then lost with its directories, and a rank on node
// b restores the step, which b's ckptd streams from the bucket as the rank
// reads it (daemon/peer/copy_landing.h, client/landing_shard.h). One step
// per run: each restore lands its copy anew.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "tools/bench_cluster.h"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"

namespace ckpt::bench {
namespace {

std::vector<BenchCluster::Spec> Nodes(const std::string& dir,
                                      const std::string& uri,
                                      const std::string& endpoint,
                                      uint64_t size_mib, int runs) {
  const std::string credentials = dir + "/s3-credentials";
  const std::string budget = absl::StrCat(2 * size_mib + 64, "M");
  std::vector<std::string> args = {"--shared-uri",
                                   uri,
                                   "--s3-endpoint",
                                   endpoint,
                                   "--s3-credentials-file",
                                   credentials,
                                   "--shared-every",
                                   "1",
                                   "--keep-shared",
                                   std::to_string(runs + 1),
                                   "--peer-replicas",
                                   "0",
                                   "--codec",
                                   "none",
                                   "--memory-budget",
                                   budget,
                                   "--keep-memory",
                                   "1"};
  return {{"a", args}, {"b", args}};
}

}  // namespace

absl::StatusOr<std::vector<double>> CkptdRestoreSeconds(
    const std::string& dir, const std::string& uri, const std::string& endpoint,
    const std::string& access_key, const std::string& secret_key,
    uint64_t size_mib, int runs) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/s3-credentials")
      << "[default]\naws_access_key_id = " << access_key
      << "\naws_secret_access_key = " << secret_key << "\n";
  BenchCluster cluster(dir + "/cluster", "s3",
                       Nodes(dir, uri, endpoint, size_mib, runs));
  if (!cluster.error().empty()) {
    return absl::UnavailableError(cluster.error());
  }
  BenchNode& a = cluster.nodes()[0];
  BenchNode& b = cluster.nodes()[1];
  const int64_t n = static_cast<int64_t>(size_mib << 20) / 4;
  std::vector<float> w(static_cast<size_t>(n));
  {
    auto c = client::Checkpointer::Connect({"s3bench", 0, 1, a.socket()});
    if (!c.ok()) return c.status();
    if (absl::Status s = (*c)->RegisterTensor("w", proto::DTYPE_FLOAT32,
                                              w.data(), {n}, {0}, {n});
        !s.ok()) {
      return s;
    }
    std::mt19937 rng(11);
    for (int run = 1; run <= runs; ++run) {
      for (float& v : w) {
        const uint32_t bits = rng();
        std::memcpy(&v, &bits, 4);  // incompressible
      }
      auto save = (*c)->SaveAsync(static_cast<uint64_t>(run));
      if (!save.ok()) return save.status();
      if (absl::Status s = (*save)->WaitCommitted(proto::TIER_SHARED);
          !s.ok()) {
        return s;
      }
    }
  }
  BenchCluster::Lose(a);
  std::vector<double> seconds;
  auto c = client::Checkpointer::Connect({.job = "s3bench",
                                          .rank = 0,
                                          .world_size = 1,
                                          .socket_path = b.socket(),
                                          .rpc_timeout = absl::Minutes(5)});
  if (!c.ok()) return c.status();
  if (absl::Status s = (*c)->RegisterTensor("w", proto::DTYPE_FLOAT32, w.data(),
                                            {n}, {0}, {n});
      !s.ok()) {
    return s;
  }
  for (int run = 1; run <= runs; ++run) {
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = (*c)->Restore(static_cast<uint64_t>(run)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("restoring step ", run,
                                                 " on node b: ", s.message(),
                                                 " (see ", b.dir, ".log)"));
    }
    seconds.push_back(tools::Seconds(start));
  }
  return seconds;
}

}  // namespace ckpt::bench
