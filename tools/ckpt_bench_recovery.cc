#include "tools/ckpt_bench.h"

// ckpt-bench: throughput of ckpt's data paths against a reference measured in
// the same run.
//
//   ckpt-bench io [--dir DIR] [--size-mib N] [--runs R] [--json]
//
// `io` persists (ShardWriter: encode, io_uring O_DIRECT writes, fsync, rename)
// and restores (ShardReader: io_uring O_DIRECT reads, checksums, decode) N MiB
// of incompressible bytes and of float32 data, and runs fio (io_uring,
// O_DIRECT, 1 MiB blocks, sequential, same queue depth) on the same directory.
// Runs are interleaved; medians are reported.
//
//   ckpt-bench recovery [--dir DIR] [--state-mib N] [--json]
//
// `recovery` loses a node of a job on three local ckptd with peer replication
// and times detection, rendezvous and the restore from the replicas (against
// a loopback TCP copy of the same bytes).
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "client/elastic.h"
#include "nlohmann/json.hpp"
#include "tools/bench_stats.h"
#include "tools/metrics_text.h"
#include "tools/process.h"

using ckpt::tools::Median;
using ckpt::tools::Seconds;

namespace {

// Loopback TCP: one connection, `bytes` sent from a thread and received into a
// buffer; MiB/s. The reference for restores from peers.
double TcpCopyMibS(uint64_t bytes) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::cerr << "ckpt-bench: loopback TCP: " << std::strerror(errno) << "\n";
    std::exit(1);
  }
  std::vector<char> out(4 << 20, 'x'), in(bytes);
  auto start = std::chrono::steady_clock::now();
  std::thread sender([&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      std::exit(1);
    for (uint64_t sent = 0; sent < bytes;) {
      ssize_t n = ::send(fd, out.data(),
                         std::min<uint64_t>(out.size(), bytes - sent), 0);
      if (n <= 0) std::exit(1);
      sent += static_cast<uint64_t>(n);
    }
    ::close(fd);
  });
  const int conn = ::accept(listener, nullptr, nullptr);
  for (uint64_t got = 0; got < bytes;) {
    ssize_t n = ::recv(conn, in.data() + got, bytes - got, 0);
    if (n <= 0) std::exit(1);
    got += static_cast<uint64_t>(n);
  }
  sender.join();
  const double s = Seconds(start);
  ::close(conn);
  ::close(listener);
  return static_cast<double>(bytes) / (1 << 20) / s;
}

// Bytes replication sent for `job`, summed over the nodes' metrics.
double ReplicatedBytes(const std::vector<std::string>& sockets,
                       const std::string& job) {
  double sum = 0;
  for (const std::string& socket : sockets) {
    if (auto text = ckpt::client::GetMetricsText(socket); text.ok()) {
      sum += ckpt::tools::SumOf(ckpt::tools::ParseMetricsText(*text),
                                "ckpt_replicated_bytes_total", {{"job", job}})
                 .value_or(0);
    }
  }
  return sum;
}

// What replication sends per save of a job saving every step, over what it
// sent for the first (full) save: two ranks on the first two of `sockets`,
// `mib` of state each, six saves waiting for each commit at tier peer.
// `frozen90`: float32 weights of which a tenth (the layers being trained)
// moves each step, by a thousandth of each value, the rest frozen; else a
// dense bfloat16 model every value of which moves so. Returns the ratio, or
// an error.
absl::StatusOr<double> NetworkBytesVsFull(
    const std::vector<std::string>& sockets, uint64_t mib, bool frozen90) {
  const std::string job = frozen90 ? "net-frozen90" : "net-dense-bf16";
  const ckpt::proto::DType dtype =
      frozen90 ? ckpt::proto::DTYPE_FLOAT32 : ckpt::proto::DTYPE_BFLOAT16;
  const size_t width = frozen90 ? 4 : 2;
  const int64_t per_rank = static_cast<int64_t>((mib << 20) / width);
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> values(2, std::vector<float>(per_rank));
  std::vector<std::vector<uint8_t>> bytes(
      2, std::vector<uint8_t>(static_cast<size_t>(per_rank) * width));
  for (auto& v : values)
    for (float& f : v) f = 0.02f * normal(rng);
  auto encode = [&](int r) {
    for (int64_t i = 0; i < per_rank; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &values[r][i], 4);
      if (frozen90) {
        std::memcpy(&bytes[r][i * 4], &bits, 4);
      } else {
        const uint16_t top = static_cast<uint16_t>(bits >> 16);
        std::memcpy(&bytes[r][i * 2], &top, 2);
      }
    }
  };
  std::vector<std::unique_ptr<ckpt::client::Checkpointer>> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    auto c = ckpt::client::Checkpointer::Connect({job, r, 2, sockets[r]});
    if (!c.ok()) return c.status();
    absl::Status reg =
        (*c)->RegisterTensor("w", dtype, bytes[r].data(), {2 * per_rank},
                             {per_rank * r}, {per_rank});
    if (!reg.ok()) return reg;
    ranks.push_back(*std::move(c));
  }
  constexpr int kSaves = 6;
  double after_first = 0;
  for (uint64_t step = 1; step <= kSaves; ++step) {
    for (int r = 0; r < 2; ++r) {
      // The moving part: all of it, or the last tenth.
      const int64_t from = step == 1 || !frozen90 ? 0 : per_rank / 10 * 9;
      for (int64_t i = from; step > 1 && i < per_rank; ++i)
        values[r][i] *= 1 + 1e-3f * normal(rng) * (frozen90 ? 1 : 4);
      encode(r);
    }
    std::vector<std::shared_ptr<ckpt::client::SaveHandle>> saves;
    for (auto& c : ranks) {
      auto save = c->SaveAsync(step);
      if (!save.ok()) return save.status();
      saves.push_back(*std::move(save));
    }
    for (auto& save : saves) {
      absl::Status st = save->WaitCommitted(ckpt::proto::TIER_PEER);
      if (!st.ok()) return st;
    }
    if (step == 1) after_first = ReplicatedBytes(sockets, job);
  }
  const double total = ReplicatedBytes(sockets, job);
  if (after_first <= 0) return absl::InternalError("no replicated bytes seen");
  return (total - after_first) / (kSaves - 1) / after_first;
}

}  // namespace

// `ckpt-bench recovery`: three ckptd on etcd with peer replication; a job of
// two ranks (nodes a and b) saves one step of `state_mib` and waits for its
// commit at tier peer; node a is then SIGKILLed and its directories deleted.
// Measured: detection (the kill until a trainer on b is told), rendezvous (the
// survivor and a replacement on node c rejoin the job's next epoch), restore
// (both ranks of the new epoch restore the step, the replacement from the
// replicas). The restore from peers is set against a plain TCP copy of the
// same bytes over loopback, measured in the same run.
namespace ckpt::bench {

int RunRecovery(const std::string& dir, uint64_t state_mib, bool json) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  ckpt::tools::LocalEtcd local_etcd(dir + "/etcd");
  if (!local_etcd.Start()) {
    std::cerr << "ckpt-bench: etcd did not start; see " << local_etcd.log_path()
              << "\n";
    return 1;
  }
  const std::string etcd = local_etcd.endpoint();
  struct Node {
    std::string id, dir, staging;
    pid_t pid = -1;
    std::string socket() const { return dir + "/run/ckptd.sock"; }
  };
  std::vector<Node> nodes;
  for (const char* id : {"node-a", "node-b", "node-c"}) {
    Node n;
    n.id = id;
    n.dir = dir + "/" + id;
    n.staging =
        absl::StrCat("/dev/shm/ckpt-bench-recovery-", ::getpid(), "-", id);
    n.pid =
        ckpt::tools::Spawn({ckpt::tools::Sibling({"../daemon/ckptd", "ckptd"}),
                            "--socket",
                            n.socket(),
                            "--data-dir",
                            n.dir + "/data",
                            "--staging-dir",
                            n.staging,
                            "--memory-budget",
                            absl::StrCat(state_mib * 2 + 64, "M"),
                            "--replica-budget",
                            absl::StrCat(state_mib * 2 + 64, "M"),
                            "--coordinator",
                            "etcd://" + etcd,
                            "--lease-ttl",
                            "2",
                            "--node-id",
                            id,
                            "--peer-address",
                            "127.0.0.1:0",
                            "--peer-replicas",
                            "1"},
                           n.dir + ".log");
    nodes.push_back(n);
  }
  auto cleanup = [&] {
    for (Node& n : nodes) {
      if (n.pid > 0) {
        ::kill(n.pid, SIGKILL);
        ::waitpid(n.pid, nullptr, 0);
      }
      std::filesystem::remove_all(n.staging, ec);
      std::filesystem::remove_all(n.staging + ".peer", ec);
    }
    local_etcd.Kill();
  };
  auto fail = [&](const std::string& what, const absl::Status& s) {
    std::cerr << "ckpt-bench: " << what << ": " << s << " (logs in " << dir
              << ")\n";
    cleanup();
    return 1;
  };
  for (Node& n : nodes) {
    bool up = false;
    for (int i = 0; i < 400 && !up; ++i) {
      up =
          ckpt::client::Checkpointer::Connect({"probe", 0, 1, n.socket()}).ok();
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    if (!up) return fail(n.id + " did not start", absl::UnavailableError(""));
  }
  // Increments over the network: what each save of a job saving every step
  // sends to peers, against its first (full) save.
  const std::vector<std::string> sockets = {
      nodes[0].socket(), nodes[1].socket(), nodes[2].socket()};
  const uint64_t net_mib =
      std::min<uint64_t>(std::max<uint64_t>(state_mib / 4, 8), 64);
  absl::StatusOr<double> net_frozen =
      NetworkBytesVsFull(sockets, net_mib, true);
  if (!net_frozen.ok())
    return fail("network bytes, frozen", net_frozen.status());
  absl::StatusOr<double> net_dense =
      NetworkBytesVsFull(sockets, net_mib, false);
  if (!net_dense.ok())
    return fail("network bytes, dense bf16", net_dense.status());
  // From the step's commit on disk to its commit at tier peer: both shard
  // files pushed (at once, each to a peer) and verified there.
  double disk_to_peer_commit_s = 0;
  // One rank's half of a float32 vector, incompressible: random bit
  // patterns, stored raw (float values of a narrow range compress by about
  // 15% with the byte shuffle, and their restore is then bound by zstd's
  // decoding on the cores there are, not by the transfer).
  const int64_t global = static_cast<int64_t>(state_mib << 20) / 4;
  const int64_t half = global / 2;
  std::mt19937 rng(7);
  std::vector<std::vector<float>> saved(2, std::vector<float>(half));
  for (auto& v : saved) {
    for (float& f : v) {
      const uint32_t bits = rng();
      std::memcpy(&f, &bits, sizeof f);
    }
  }
  auto connect = [&](const Node& n, uint32_t rank, std::vector<float>* w)
      -> absl::StatusOr<std::unique_ptr<ckpt::client::Checkpointer>> {
    auto c =
        ckpt::client::Checkpointer::Connect({"recovery", rank, 2, n.socket()});
    if (!c.ok()) return c.status();
    absl::Status r =
        (*c)->RegisterTensor("w", ckpt::proto::DTYPE_FLOAT32, w->data(),
                             {global}, {half * rank}, {half});
    if (!r.ok()) return r;
    return c;
  };
  {
    std::vector<std::shared_ptr<ckpt::client::SaveHandle>> saves;
    std::vector<std::unique_ptr<ckpt::client::Checkpointer>> ranks;
    for (uint32_t r = 0; r < 2; ++r) {
      auto c = connect(nodes[r], r, &saved[r]);
      if (!c.ok())
        return fail("connecting rank " + std::to_string(r), c.status());
      auto save = (*c)->SaveAsync(1);
      if (!save.ok()) return fail("saving", save.status());
      saves.push_back(*std::move(save));
      ranks.push_back(*std::move(c));
    }
    for (auto& s : saves) {
      absl::Status st = s->WaitCommitted(ckpt::proto::TIER_LOCAL_DISK);
      if (!st.ok()) return fail("persisting step 1", st);
    }
    const auto replicating = std::chrono::steady_clock::now();
    for (auto& s : saves) {
      absl::Status st = s->WaitCommitted(ckpt::proto::TIER_PEER);
      if (!st.ok()) return fail("replicating step 1", st);
    }
    disk_to_peer_commit_s = Seconds(replicating);
  }
  // The survivor's trainer on node b watches for failures.
  std::vector<float> survivor_w(half), replacement_w(half);
  auto watcher = connect(nodes[1], 1, &survivor_w);
  if (!watcher.ok()) return fail("connecting the survivor", watcher.status());
  std::atomic<bool> told{false};
  absl::Status watching = (*watcher)->WatchFailures(
      [&](const std::vector<std::string>&) { told = true; });
  if (!watching.ok()) return fail("watching failures", watching);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto killed = std::chrono::steady_clock::now();
  ::kill(nodes[0].pid, SIGKILL);
  ::waitpid(nodes[0].pid, nullptr, 0);
  nodes[0].pid = -1;
  std::filesystem::remove_all(nodes[0].dir + "/data", ec);
  std::filesystem::remove_all(nodes[0].staging, ec);
  std::filesystem::remove_all(nodes[0].staging + ".peer", ec);
  while (!told && Seconds(killed) < 60) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double detect_s = Seconds(killed);
  if (!told) return fail("detecting the loss", absl::DeadlineExceededError(""));
  // The survivor and the replacement rejoin.
  auto rendezvous_start = std::chrono::steady_clock::now();
  std::vector<absl::StatusOr<ckpt::client::Epoch>> epochs(2);
  {
    std::vector<std::thread> joiners;
    for (int i = 0; i < 2; ++i) {
      joiners.emplace_back([&, i] {
        epochs[i] = ckpt::client::Rejoin(
            {.job = "recovery",
             .socket_path = nodes[i + 1].socket(),
             .participant = i == 0 ? "b-survivor" : "c-replacement",
             .min_ranks = 2,
             .max_ranks = 2,
             .timeout = absl::Seconds(60)});
      });
    }
    for (auto& t : joiners) t.join();
  }
  const double rendezvous_s = Seconds(rendezvous_start);
  for (auto& e : epochs) {
    if (!e.ok()) return fail("rejoining", e.status());
  }
  // The survivor keeps rank 1 on b; the replacement takes rank 0 on c.
  auto replacement = connect(nodes[2], 0, &replacement_w);
  if (!replacement.ok())
    return fail("connecting the replacement", replacement.status());
  // The replacement restores its rank from the peers, then the survivor its
  // own from local memory. In a real recovery they run at once on separate
  // machines; on one machine running them at once only shares its cores, so
  // they run one after the other and the restore time is their sum.
  auto restore_start = std::chrono::steady_clock::now();
  absl::Status restored_peer = (*replacement)->Restore(1);
  const double peer_restore_s = Seconds(restore_start);
  auto local_start = std::chrono::steady_clock::now();
  absl::Status restored_local = (*watcher)->Restore(1);
  const double local_restore_s = Seconds(local_start);
  const double restore_s = peer_restore_s + local_restore_s;
  if (!restored_peer.ok()) return fail("restoring from peers", restored_peer);
  if (!restored_local.ok()) return fail("restoring locally", restored_local);
  // Bit patterns (NaNs among them): compared as bytes.
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() &&
           std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  if (!same(replacement_w, saved[0]) || !same(survivor_w, saved[1])) {
    return fail("checking", absl::DataLossError("restored state differs"));
  }
  // Node c's daemon's side of the peer restore: the shard file's transfer
  // into its memory, checked (ckpt_peer_fetch*_total).
  double fetched_bytes = 0, fetch_s = 0;
  if (auto text = ckpt::client::GetMetricsText(nodes[2].socket()); text.ok()) {
    const auto samples = ckpt::tools::ParseMetricsText(*text);
    fetched_bytes = ckpt::tools::SumOf(samples, "ckpt_peer_fetched_bytes_total",
                                       {{"job", "recovery"}})
                        .value_or(0);
    fetch_s = ckpt::tools::SumOf(samples, "ckpt_peer_fetch_seconds_total",
                                 {{"job", "recovery"}})
                  .value_or(0);
  }
  const double shard_mib = static_cast<double>(half) * 4 / (1 << 20);
  const double peer_mib_s = shard_mib / peer_restore_s;
  const double fetch_mib_s =
      fetch_s > 0 ? fetched_bytes / (1 << 20) / fetch_s : 0;
  // The reference: loopback TCP copies of the same bytes, right after the
  // restore on the same loaded machine (the daemons still up); the median of
  // three, as one copy varies by 2x here.
  std::vector<double> tcp_runs;
  for (int i = 0; i < 3; ++i) {
    tcp_runs.push_back(TcpCopyMibS(static_cast<uint64_t>(half) * 4));
  }
  const double tcp_mib_s = Median(tcp_runs);
  cleanup();
  nlohmann::json j;
  j["benchmark"] = "recovery";
  j["state_mib"] = state_mib;
  j["lease_ttl_s"] = 2;
  j["detect_s"] = detect_s;
  j["rendezvous_s"] = rendezvous_s;
  j["restore_s"] = restore_s;
  j["recovery_s"] = detect_s + rendezvous_s + restore_s;
  j["disk_to_peer_commit_s"] = disk_to_peer_commit_s;
  j["restore_from_peer_s"] = peer_restore_s;
  j["restore_local_s"] = local_restore_s;
  j["restore_from_peer_mib_s"] = peer_mib_s;
  j["tcp_loopback_mib_s"] = tcp_mib_s;
  j["tcp_loopback_runs_mib_s"] = tcp_runs;
  j["restore_from_peer_vs_tcp"] = peer_mib_s / tcp_mib_s;
  j["fetch_from_peer_mib_s"] = fetch_mib_s;
  j["fetch_from_peer_vs_tcp"] = fetch_mib_s / tcp_mib_s;
  j["network_state_mib_per_rank"] = net_mib;
  j["network_bytes_vs_full"] = *net_frozen;
  j["network_bytes_vs_full_dense_bf16"] = *net_dense;
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf(
        "recovery of a %llu MiB job after a node loss: %.2f s (detect %.2f s "
        "with a 2 s lease, rendezvous %.2f s, restore %.2f s)\n"
        "restore of the lost rank from peers: %.0f MiB/s (its shard file's "
        "fetch %.0f MiB/s); loopback TCP copy %.0f MiB/s; ratio %.2f (fetch "
        "%.2f)\n"
        "replication per save of a job saving every step, over its full "
        "save: %.3f (90%% frozen, float32), %.3f (dense, bfloat16)\n",
        static_cast<unsigned long long>(state_mib),
        detect_s + rendezvous_s + restore_s, detect_s, rendezvous_s, restore_s,
        peer_mib_s, fetch_mib_s, tcp_mib_s, peer_mib_s / tcp_mib_s,
        fetch_mib_s / tcp_mib_s, *net_frozen, *net_dense);
  }
  return 0;
}

}  // namespace ckpt::bench
