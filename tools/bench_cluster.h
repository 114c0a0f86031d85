// BenchCluster: ckptd processes on loopback around a local etcd, for the
// benchmarks that need several nodes (ckpt-bench recovery --redundancy,
// ckpt-bench publish). Each node has its own data directory under the
// cluster's, a tmpfs staging directory, a peer address on 127.0.0.1 and a
// 2 s lease; its log is <dir>/<node>.log. Nodes are killed (SIGKILL) and
// their directories removed when the cluster goes.
//
// Thread-safety: one thread.
#ifndef CKPT_TOOLS_BENCH_CLUSTER_H_
#define CKPT_TOOLS_BENCH_CLUSTER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "tools/process.h"

namespace ckpt::bench {

struct BenchNode {
  std::string id, dir, staging;
  pid_t pid = -1;
  std::string socket() const { return dir + "/run/ckptd.sock"; }
  std::string peer_dir() const { return staging + ".peer"; }
  std::string publish_dir() const { return staging + ".publish"; }
};

class BenchCluster {
 public:
  struct Spec {
    std::string id;
    std::vector<std::string> args;  // besides the cluster's own
  };
  // Starts etcd and the nodes (waiting until each accepts a trainer);
  // error() says what did not start.
  BenchCluster(std::string dir, const std::string& name,
               const std::vector<Spec>& nodes);
  ~BenchCluster();

  const std::string& error() const { return error_; }
  std::vector<BenchNode>& nodes() { return nodes_; }
  static void Kill(BenchNode& n);
  // Lost with everything it had.
  static void Lose(BenchNode& n);

 private:
  std::string dir_;
  tools::LocalEtcd etcd_;
  std::vector<BenchNode> nodes_;
  std::string error_;
};

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_CLUSTER_H_
