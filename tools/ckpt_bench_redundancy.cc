// `ckpt-bench recovery --redundancy rs:K+M`: the erasure-coded peer tier
// against full replicas, in the same run. Six ckptd on a local etcd hold a job
// of six ranks (one per node), first with `--peer-redundancy rs:K+M`, then
// with `--peer-replicas M` (the replicas that survive the same M losses). Each
// time one step is saved and committed at tier peer, M nodes are SIGKILLed at
// once with their directories, and their ranks restore on surviving nodes.
// Measured:
//   peer_memory_vs_replicas: bytes the peer tier holds (parity blocks against
//     replica files);
//   encode_vs_memcpy: one data block's parity contributions as the daemon
//     computes them (ErasureCode::ContributeTo for the M-1 coded ones; parity
//     block 0's is the block itself, sent as it is) against memcpy of the
//     same bytes, on one core;
//   decode_restore_vs_replica_restore: restore of the lost ranks by decoding
//     against restore by fetching replicas (throughput ratio);
//   recovery_s: from the kill to the lost ranks' state back in memory
//     (detection through the 2 s lease, then the restores), with parity.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "io/status_macros.h"
#include "nlohmann/json.hpp"
#include "snapshot/erasure_code.h"
#include "tools/bench_cluster.h"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"
#include "tools/process.h"

using ckpt::tools::Median;
using ckpt::tools::Seconds;

namespace ckpt::bench {
namespace {

constexpr int kNodes = 6;

uint64_t BytesUnder(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); ++it) {
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  }
  return n;
}

// One measurement of a protection mode on a fresh cluster.
struct Phase {
  uint64_t held_bytes = 0;      // the peer tier's, all nodes
  double disk_to_peer_s = 0;    // commit on disk to commit at tier peer
  double detect_s = 0;          // kill to a survivor's trainer told
  double restore_s = 0;         // the lost ranks restored, one after another
  uint64_t restored_bytes = 0;  // their state
  std::vector<double> rank_restore_s;  // each lost rank's, in order
};

// Saves one step of `state` (kNodes ranks, rank r on node r), loses `lost`
// nodes at once and restores their ranks on the nodes after them.
absl::StatusOr<Phase> RunPhase(const std::string& dir,
                               std::vector<std::string> mode_args,
                               const std::vector<std::vector<float>>& state,
                               int lost) {
  std::vector<BenchCluster::Spec> specs;
  for (int i = 0; i < kNodes; ++i) {
    BenchCluster::Spec spec{
        std::string("node-") + static_cast<char>('a' + i),
        {"--memory-budget", "1G", "--replica-budget", "1G"}};
    spec.args.insert(spec.args.end(), mode_args.begin(), mode_args.end());
    specs.push_back(std::move(spec));
  }
  BenchCluster cluster(dir, "redundancy", specs);
  if (!cluster.error().empty()) {
    return absl::UnavailableError(cluster.error());
  }
  std::vector<BenchNode>& nodes = cluster.nodes();
  const int64_t per_rank = static_cast<int64_t>(state[0].size());
  const int64_t global = per_rank * kNodes;
  auto connect =
      [&](const BenchNode& n, uint32_t rank,
          float* w) -> absl::StatusOr<std::unique_ptr<client::Checkpointer>> {
    auto c = client::Checkpointer::Connect(
        {"redundancy", rank, static_cast<uint32_t>(kNodes), n.socket()});
    if (!c.ok()) return c.status();
    absl::Status r = (*c)->RegisterTensor(
        "w", proto::DTYPE_FLOAT32, w, {global}, {per_rank * rank}, {per_rank});
    if (!r.ok()) return r;
    return c;
  };
  Phase phase;
  std::vector<std::vector<float>> saving = state;
  {
    std::vector<std::unique_ptr<client::Checkpointer>> ranks;
    std::vector<std::shared_ptr<client::SaveHandle>> saves;
    for (int r = 0; r < kNodes; ++r) {
      auto c = connect(nodes[r], r, saving[r].data());
      if (!c.ok()) return c.status();
      auto save = (*c)->SaveAsync(1);
      if (!save.ok()) return save.status();
      saves.push_back(*std::move(save));
      ranks.push_back(*std::move(c));
    }
    for (auto& s : saves) {
      absl::Status st = s->WaitCommitted(proto::TIER_LOCAL_DISK);
      if (!st.ok()) return st;
    }
    const auto protecting = std::chrono::steady_clock::now();
    for (auto& s : saves) {
      absl::Status st = s->WaitCommitted(proto::TIER_PEER, absl::Seconds(300));
      if (!st.ok()) return st;
    }
    phase.disk_to_peer_s = Seconds(protecting);
  }
  for (BenchNode& n : nodes)
    phase.held_bytes += BytesUnder(n.peer_dir() + "/held");
  for (BenchNode& n : nodes) {
    phase.held_bytes += BytesUnder(n.peer_dir() + "/parity");
  }
  // A survivor's trainer watches for failures.
  std::vector<float> scratch(per_rank);
  auto watcher = connect(nodes[kNodes - 1], kNodes - 1, scratch.data());
  if (!watcher.ok()) return watcher.status();
  std::atomic<bool> told{false};
  RETURN_IF_ERROR((*watcher)->WatchFailures(
      [&](const std::vector<std::string>&) { told = true; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto killed = std::chrono::steady_clock::now();
  for (int i = 0; i < lost; ++i) BenchCluster::Lose(nodes[i]);
  while (!told && Seconds(killed) < 60) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!told) return absl::DeadlineExceededError("the loss was not detected");
  phase.detect_s = Seconds(killed);
  // Rank i of a lost node restores on node lost + i, one after another (on
  // one machine, at once would only share its two cores), into tensors that
  // exist already, as a trainer's do (allocated and touched off the clock).
  std::vector<std::vector<float>> restored(lost, std::vector<float>(per_rank));
  const auto restoring = std::chrono::steady_clock::now();
  for (int i = 0; i < lost; ++i) {
    std::vector<float>& w = restored[i];
    const auto rank_start = std::chrono::steady_clock::now();
    auto c = connect(nodes[lost + i], i, w.data());
    if (!c.ok()) return c.status();
    absl::Status st = (*c)->Restore(1);
    if (!st.ok()) return st;
    phase.rank_restore_s.push_back(Seconds(rank_start));
    if (std::memcmp(w.data(), state[i].data(), w.size() * sizeof(float)) != 0) {
      return absl::DataLossError(absl::StrCat("rank ", i, " restored wrong"));
    }
    phase.restored_bytes += w.size() * sizeof(float);
  }
  phase.restore_s = Seconds(restoring);
  return phase;
}

}  // namespace

int RunRedundancy(const std::string& dir, uint64_t state_mib,
                  const std::string& redundancy, bool json) {
  absl::StatusOr<snapshot::ErasureCode> code =
      snapshot::ErasureCode::Parse(redundancy);
  if (!code.ok()) {
    std::cerr << "ckpt-bench: " << code.status().message() << "\n";
    return 2;
  }
  if (code->m() >= kNodes) {
    std::cerr << "ckpt-bench: " << redundancy << " loses more nodes than the "
              << kNodes << " there are\n";
    return 2;
  }
  // Encode against memcpy on one core: 64 MiB in 1 MiB segments (as the
  // daemon encodes a shard file: each segment's contributions are sent, and
  // the buffers used again), median of 5.
  constexpr size_t kSegment = 1 << 20;
  std::mt19937_64 rng(7);
  std::vector<uint8_t> block(64 << 20), copy(kSegment);
  for (size_t i = 0; i < block.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&block[i], &v, 8);
  }
  std::vector<std::vector<uint8_t>> out(code->m(),
                                        std::vector<uint8_t>(kSegment));
  std::vector<double> encode_runs, memcpy_runs;
  for (int run = 0; run < 5; ++run) {
    auto t = std::chrono::steady_clock::now();
    for (size_t at = 0; at < block.size(); at += kSegment) {
      // What the daemon computes: parity block 0's contribution is the
      // segment itself (sent as it is), the others are multiplied.
      for (int j = 0; j < code->m(); ++j) {
        if (code->Plain(0, j)) continue;
        code->ContributeTo(0, j,
                           absl::MakeConstSpan(block).subspan(at, kSegment),
                           out[j].data());
      }
    }
    encode_runs.push_back(block.size() / Seconds(t) / (1 << 20));
    t = std::chrono::steady_clock::now();
    for (size_t at = 0; at < block.size(); at += kSegment) {
      std::memcpy(copy.data(), block.data() + at, kSegment);
    }
    memcpy_runs.push_back(block.size() / Seconds(t) / (1 << 20));
  }
  const double encode_mib_s = Median(encode_runs);
  const double memcpy_mib_s = Median(memcpy_runs);

  // The job's state: incompressible float bit patterns (stored raw).
  const size_t per_rank = (state_mib << 20) / kNodes / sizeof(float);
  std::vector<std::vector<float>> state(kNodes, std::vector<float>(per_rank));
  for (auto& v : state) {
    for (float& f : v) {
      const uint32_t bits = static_cast<uint32_t>(rng());
      std::memcpy(&f, &bits, sizeof f);
    }
  }
  absl::StatusOr<Phase> parity = RunPhase(
      dir + "/parity", {"--peer-redundancy", redundancy}, state, code->m());
  if (!parity.ok()) {
    std::cerr << "ckpt-bench: with " << redundancy << ": " << parity.status()
              << " (logs in " << dir << "/parity)\n";
    return 1;
  }
  absl::StatusOr<Phase> replicas = RunPhase(
      dir + "/replicas", {"--peer-replicas", std::to_string(code->m())}, state,
      code->m());
  if (!replicas.ok()) {
    std::cerr << "ckpt-bench: with " << code->m()
              << " replicas: " << replicas.status() << " (logs in " << dir
              << "/replicas)\n";
    return 1;
  }
  auto mib_s = [](const Phase& p) {
    return static_cast<double>(p.restored_bytes) / (1 << 20) / p.restore_s;
  };
  nlohmann::json j;
  j["benchmark"] = "recovery_redundancy";
  j["redundancy"] = redundancy;
  j["nodes"] = kNodes;
  j["lost_nodes"] = code->m();
  j["state_mib"] = state_mib;
  j["peer_bytes_parity"] = parity->held_bytes;
  j["peer_bytes_replicas"] = replicas->held_bytes;
  j["peer_memory_vs_replicas"] = static_cast<double>(parity->held_bytes) /
                                 static_cast<double>(replicas->held_bytes);
  j["encode_mib_s"] = encode_mib_s;
  j["memcpy_mib_s"] = memcpy_mib_s;
  j["encode_runs_mib_s"] = encode_runs;
  j["memcpy_runs_mib_s"] = memcpy_runs;
  j["encode_vs_memcpy"] = encode_mib_s / memcpy_mib_s;
  j["decode_restore_mib_s"] = mib_s(*parity);
  j["replica_restore_mib_s"] = mib_s(*replicas);
  j["decode_restore_vs_replica_restore"] = mib_s(*parity) / mib_s(*replicas);
  j["disk_to_peer_commit_s_parity"] = parity->disk_to_peer_s;
  j["disk_to_peer_commit_s_replicas"] = replicas->disk_to_peer_s;
  j["detect_s"] = parity->detect_s;
  j["restore_s"] = parity->restore_s;
  j["rank_restore_s_parity"] = parity->rank_restore_s;
  j["rank_restore_s_replicas"] = replicas->rank_restore_s;
  j["recovery_s"] = parity->detect_s + parity->restore_s;
  j["recovery_s_replicas"] = replicas->detect_s + replicas->restore_s;
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf(
        "%s on %d nodes, %d lost at once, %llu MiB of state:\n"
        "  peer memory %.2f of %d replicas' (%llu against %llu bytes)\n"
        "  encode %.0f MiB/s, memcpy %.0f MiB/s: %.2f\n"
        "  restore of the lost ranks: decoding %.0f MiB/s, replicas %.0f "
        "MiB/s: %.2f\n"
        "  recovery %.2f s (detect %.2f s, restore %.2f s); with replicas "
        "%.2f s\n",
        redundancy.c_str(), kNodes, code->m(),
        static_cast<unsigned long long>(state_mib),
        j["peer_memory_vs_replicas"].get<double>(), code->m(),
        static_cast<unsigned long long>(parity->held_bytes),
        static_cast<unsigned long long>(replicas->held_bytes), encode_mib_s,
        memcpy_mib_s, encode_mib_s / memcpy_mib_s, mib_s(*parity),
        mib_s(*replicas), mib_s(*parity) / mib_s(*replicas),
        parity->detect_s + parity->restore_s, parity->detect_s,
        parity->restore_s, replicas->detect_s + replicas->restore_s);
  }
  return 0;
}

}  // namespace ckpt::bench
