// ckpt-chaos's command line: see tools/chaos.h for what the harness does.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "snapshot/erasure_code.h"
#include "spdlog/spdlog.h"
#include "tools/chaos.h"

using ckpt::chaos::Chaos;
using ckpt::chaos::Options;
using ckpt::tools::Sibling;

int main(int argc, char** argv) {
  CLI::App app{
      "ckpt-chaos: inject faults into a local cluster (ckptd, with --nodes "
      "also "
      "etcd) and its job, and prove "
      "that nothing committed is lost"};
  Options o;
  o.seed = std::random_device{}();
  // The build tree's layout, else the installed one.
  o.ckptd = Sibling({"../daemon/ckptd", "ckptd"});
  o.trainer = Sibling({"ckpt-demo-trainer", "../lib/ckpt/ckpt-demo-trainer"});
  o.certs_tool = Sibling("ckpt-certs");
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
                 "simulated compute per step (default 10 on one node, 150 on "
                 "several: each vote is then an etcd transaction, and faster "
                 "saves saturate etcd on a small machine)")
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
  app.add_option("--peer-redundancy", o.peer_redundancy,
                 "with --nodes: the peer tier as parity (rs:K+M, every "
                 "node's --peer-redundancy) instead of one replica per shard");
  app.add_option("--kinds", o.kinds,
                 "only these fault kinds, comma-separated (default: all the "
                 "cluster can take)")
      ->delimiter(',');
  app.add_flag("--object-store", o.object_store,
               "with --nodes: the shared tier in a bucket of a local S3 "
               "server (SeaweedFS) behind a fault proxy; adds the faults "
               "kill_object_store and object_store_errors");
  app.add_flag("--json", o.json, "print the report as one JSON object");
  app.add_option("--ckptd", o.ckptd, "the daemon binary");
  app.add_option("--trainer", o.trainer, "the rank binary (ckpt-demo-trainer)");
  CLI11_PARSE(app, argc, argv);
  // libckpt's warnings about tiers it fell back from are expected here (the
  // harness restores steps the daemon is collecting); violations are reported.
  spdlog::set_level(spdlog::level::err);
  if (o.step_ms < 0) o.step_ms = o.nodes == 1 ? 10 : 150;
  if (o.faults == 0 && o.duration_s == 0) {
    std::fprintf(stderr, "ckpt-chaos: give --faults or --duration\n");
    return 2;
  }
  if (!o.peer_redundancy.empty()) {
    absl::StatusOr<ckpt::snapshot::ErasureCode> code =
        ckpt::snapshot::ErasureCode::Parse(o.peer_redundancy);
    if (!code.ok()) {
      std::fprintf(stderr, "ckpt-chaos: --peer-redundancy: %s\n",
                   std::string(code.status().message()).c_str());
      return 2;
    }
    if (o.nodes <= static_cast<uint32_t>(code->m())) {
      std::fprintf(stderr,
                   "ckpt-chaos: --peer-redundancy %s needs more than %d "
                   "nodes (--nodes)\n",
                   o.peer_redundancy.c_str(), code->m());
      return 2;
    }
  }
  if (o.object_store && o.nodes < 2) {
    std::fprintf(stderr,
                 "ckpt-chaos: --object-store needs several nodes (--nodes): "
                 "one node has no shared tier\n");
    return 2;
  }
  const std::vector<std::string> known =
      Chaos::Kinds(o.nodes > 1, o.object_store);
  for (const std::string& k : o.kinds) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::fprintf(stderr,
                   "ckpt-chaos: --kinds: '%s' is no fault kind of a %s "
                   "cluster%s; the kinds are %s\n",
                   k.c_str(), o.nodes > 1 ? "several-node" : "one-node",
                   o.object_store ? " on an object store" : "",
                   absl::StrJoin(known, ", ").c_str());
      return 2;
    }
  }
  // A directory of its own is removed once a run passed (hundreds of MiB of
  // data directories and logs); one that failed is kept to look into.
  const bool own_dir = o.dir.empty();
  if (own_dir) {
    o.dir = (std::filesystem::temp_directory_path() /
             absl::StrCat("ckpt-chaos-", ::getpid()))
                .string();
  }
  std::filesystem::create_directories(o.dir);
  if (!o.json) {
    std::printf("ckpt-chaos: seed %lu, working directory %s%s\n",
                static_cast<unsigned long>(o.seed), o.dir.c_str(),
                own_dir ? " (removed if the run passes)" : "");
    std::fflush(stdout);
  }
  const int rc = Chaos(o).Run();
  if (rc == 0 && own_dir) {
    std::error_code ignored;
    std::filesystem::remove_all(o.dir, ignored);
  }
  return rc;
}
