// ckptd: the per-node checkpoint daemon.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/checkpoint_service.h"
#include "daemon/etcd_coordinator.h"
#include "daemon/local_api.h"
#include "daemon/metrics_server.h"
#include "daemon/peer_service.h"
#include "daemon/supervisor_notify.h"
#include "io/logging.h"
#include "nlohmann/json.hpp"

namespace {

// "512M", "4G", "1048576" -> bytes.
bool ParseBytes(std::string s, uint64_t* out) {
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
      case 'k':
        mult = 1ull << 10;
        break;
      case 'M':
      case 'm':
        mult = 1ull << 20;
        break;
      case 'G':
      case 'g':
        mult = 1ull << 30;
        break;
      case 'T':
      case 't':
        mult = 1ull << 40;
        break;
      default:
        break;
    }
    if (mult != 1) s.pop_back();
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(s, &v) || v == 0) return false;
  *out = v * mult;
  return true;
}

void Notify(const ckpt::daemon::SupervisorNotify& notify,
            absl::string_view state) {
  absl::Status s = notify.Send(state);
  if (!s.ok()) CKPT_LOG_WARN("ckptd: {}", s.ToString());
}

// Pings the supervisor's watchdog twice per interval while the service is
// live. Once something has been stuck for half the interval it stops, so the
// supervisor kills and restarts the wedged daemon (which then adopts its
// staged shards).
void Watchdog(const ckpt::daemon::SupervisorNotify& notify,
              const ckpt::daemon::CheckpointService& service,
              absl::Notification& stop) {
  const absl::Duration interval = *notify.watchdog();
  bool pinging = true;
  do {
    absl::Status live = service.Liveness(interval / 2);
    if (live.ok()) {
      if (!pinging) CKPT_LOG_INFO("ckptd: live again; watchdog pings resume");
      pinging = true;
      Notify(notify, "WATCHDOG=1");
    } else if (pinging) {
      CKPT_LOG_ERROR(
          "ckptd: watchdog pings stop, so the supervisor restarts "
          "ckptd: {}",
          live.ToString());
      pinging = false;
    }
  } while (!stop.WaitForNotificationWithTimeout(interval / 4));
}

// Lets a stop take `timeout`, then makes the persists still in flight stop at
// their next chunk; exits the process if even that hangs (a write stuck in
// the kernel).
void StopDeadline(absl::Duration timeout, std::atomic<bool>& cancel,
                  absl::Notification& stopped) {
  if (stopped.WaitForNotificationWithTimeout(timeout)) return;
  CKPT_LOG_WARN(
      "ckptd: persists still in flight after --stop-timeout {}: stopping "
      "them; their shards stay staged for the next start",
      absl::FormatDuration(timeout));
  cancel.store(true);
  if (stopped.WaitForNotificationWithTimeout(absl::Seconds(30))) return;
  CKPT_LOG_ERROR(
      "ckptd: still stopping 30 s later (a write hangs in the "
      "kernel?): exiting now");
  std::_Exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string uid = std::to_string(::geteuid());
  // $CKPT_SOCKET, as trainers and ckpt read it, else the uid's default.
  const char* socket_env = std::getenv("CKPT_SOCKET");
  std::string socket_path =
      socket_env != nullptr && socket_env[0] != '\0'
          ? std::string(socket_env)
          : absl::StrCat("/tmp/ckpt-", uid, "/ckptd.sock");
  std::string data_dir = absl::StrCat("/tmp/ckpt-", uid, "/data");
  std::string staging_dir = absl::StrCat("/dev/shm/ckpt-", uid, "-staging");
  std::string budget = "4G";
  std::string policy = "wait";
  double wait_timeout_s = 60;
  int keep_disk = 2, keep_memory = 1, persist_threads = 2, zstd_level = 1;
  int recycle_files = 2;
  int full_every = 10;
  std::string node_id;
  std::string metrics_address;
  bool metrics_allow_remote = false;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) node_id = host;

  CLI::App app{"ckptd: the ckpt checkpoint daemon of this node"};
  app.add_option("--socket", socket_path,
                 "unix socket of the local API (its directory becomes 0700)")
      ->capture_default_str();
  app.add_option("--data-dir", data_dir, "catalog and persisted shards")
      ->capture_default_str();
  app.add_option("--staging-dir", staging_dir,
                 "memory tier: staging slots (use tmpfs)")
      ->capture_default_str();
  app.add_option("--memory-budget", budget,
                 "bytes of staging slots, e.g. 512M, 4G")
      ->capture_default_str();
  app.add_option("--full-policy", policy,
                 "when the budget is exhausted: wait or skip")
      ->check(CLI::IsMember({"wait", "skip"}))
      ->capture_default_str();
  app.add_option("--wait-timeout", wait_timeout_s,
                 "seconds the wait policy waits")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--keep-disk", keep_disk, "committed steps kept on local disk")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--keep-memory", keep_memory, "committed steps kept in memory")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--full-every", full_every,
                 "incremental saves: every Nth save of a rank stores every "
                 "chunk, the others only what changed since the rank's last "
                 "save; 1: every save is full")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  double idle_ttl_s = 600;
  app.add_option("--idle-job-memory-ttl", idle_ttl_s,
                 "seconds after its last trainer detached (and its last "
                 "save) that a job gives up its memory-tier copies that are "
                 "safe on disk or at peers; 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--recycle-files", recycle_files,
                 "shard files retired by garbage collection that are kept for "
                 "the next persists to write over (0: delete them)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--persist-threads", persist_threads,
                 "threads persisting shards")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--zstd-level", zstd_level,
                 "zstd level of the persisted chunks")
      ->check(CLI::Range(-7, 19))
      ->capture_default_str();
  std::string codec = "adaptive";
  app.add_option("--codec", codec,
                 "adaptive: compress (byte-shuffle + zstd) as much as the "
                 "disk's speed allows, storing chunks raw whenever the disk "
                 "would otherwise wait for the compressor; zstd: compress "
                 "every chunk that shrinks; none: store every chunk raw")
      ->check(CLI::IsMember({"adaptive", "zstd", "none"}))
      ->capture_default_str();
  int zstd_max_level = 1;
  app.add_option("--zstd-max-level", zstd_max_level,
                 "adaptive codec: the highest zstd level it may raise chunks "
                 "to while the disk is the bottleneck (at least --zstd-level; "
                 "level 1 and this at 1 never raise it)")
      ->check(CLI::Range(-7, 19))
      ->capture_default_str();
  app.add_option("--node-id", node_id, "this node's name")
      ->capture_default_str();
  app.add_option("--metrics-address", metrics_address,
                 "serve Prometheus metrics at http://HOST:PORT/metrics (off "
                 "when empty; port 0 picks one)");
  app.add_flag("--metrics-allow-remote", metrics_allow_remote,
               "allow a non-loopback --metrics-address");
  std::string coordinator = "embedded";
  app.add_option("--coordinator", coordinator,
                 "embedded (one node), or etcd://host:port[,host:port...]")
      ->capture_default_str();
  double lease_ttl_s = 10;
  app.add_option("--lease-ttl", lease_ttl_s,
                 "seconds without keep-alive before etcd declares this node "
                 "dead (it is then fenced until it rejoins)")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  std::string peer_address, failure_domain, replica_dir, replica_budget = "1G";
  std::string tls_ca, tls_cert, tls_key;
  int peer_replicas = 1;
  app.add_option("--peer-address", peer_address,
                 "HOST:PORT of this node's peer service (port 0 picks one): "
                 "turns on peer replication (tier T1) and restores from peers; "
                 "needs --coordinator etcd://... to find the other nodes");
  app.add_option("--peer-replicas", peer_replicas,
                 "K: peers that keep a replica of each persisted shard")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  app.add_option("--failure-domain", failure_domain,
                 "this node's failure domain (rack, switch): replicas go to "
                 "other domains first");
  app.add_option("--replica-dir", replica_dir,
                 "tmpfs directory for the replicas held for peers and the "
                 "copies fetched from them (default: <staging-dir>.peer)");
  app.add_option("--replica-budget", replica_budget,
                 "bytes of replicas held for peers, e.g. 512M, 4G (fetched "
                 "copies get as much again)")
      ->capture_default_str();
  app.add_option("--peer-tls-ca", tls_ca,
                 "mutual TLS between peers: PEM file of the CA that signs "
                 "every node's certificate");
  app.add_option("--peer-tls-cert", tls_cert,
                 "mutual TLS: this node's certificate (PEM)");
  app.add_option("--peer-tls-key", tls_key,
                 "mutual TLS: this node's private key (PEM)");
  std::string shared_dir;
  uint64_t shared_every = 1;
  int keep_shared = 2;
  app.add_option("--shared-dir", shared_dir,
                 "tier T3: a directory every node sees (NFS, Lustre, any "
                 "POSIX mount) that persisted shards are also copied to");
  app.add_option("--shared-every", shared_every,
                 "copy the steps that are multiples of this to --shared-dir")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--keep-shared", keep_shared,
                 "committed steps kept in --shared-dir")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  bool fault_injection = false;
  app.add_flag("--fault-injection", fault_injection,
               "chaos testing: write through the fault-injecting file system "
               "and accept InjectFaults calls (never in production)");
  double stop_timeout_s = 60;
  app.add_option("--stop-timeout", stop_timeout_s,
                 "on SIGTERM, seconds to let the persists in flight finish; "
                 "then they stop at their next chunk, their temporary files "
                 "are removed and their shards stay staged for the next start")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.set_config("--config", "",
                 "read settings from this TOML file: one `key = value` per "
                 "long option (memory-budget = \"8G\", peer-replicas = 2, "
                 "fault-injection = false); options on the command line win; "
                 "unknown keys are refused")
      ->check(CLI::ExistingFile);
  app.allow_config_extras(CLI::config_extras_mode::error);
  bool print_config = false;
  app.add_flag("--print-config", print_config,
               "print the effective settings (defaults, --config file and "
               "options) as a config file, then exit")
      ->configurable(false);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ConfigError& e) {
    // The one place CLI11's config errors become ours: name the file and key.
    std::string what = e.what();
    const std::string prefix = "INI was not able to parse ";
    if (what.rfind(prefix, 0) == 0) {
      what = absl::StrCat("unknown key \"", what.substr(prefix.size()),
                          "\" (ckptd --print-config lists every key)");
    }
    std::fprintf(stderr, "ckptd: --config %s: %s\n",
                 app["--config"]->as<std::string>().c_str(), what.c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, or the error
    return rc == 0 ? 0 : 2;
  }
  if (print_config) {
    std::cout << app.config_to_str(/*default_also=*/true,
                                   /*write_description=*/true);
    return 0;
  }

  ckpt::daemon::ServiceOptions options;
  options.data_dir = data_dir;
  options.staging.dir = staging_dir;
  if (!ParseBytes(budget, &options.staging.budget_bytes)) {
    std::fprintf(
        stderr, "ckptd: --memory-budget \"%s\" is not a size like 512M or 4G\n",
        budget.c_str());
    return 2;
  }
  options.staging.policy = policy == "skip" ? ckpt::daemon::FullPolicy::kSkip
                                            : ckpt::daemon::FullPolicy::kWait;
  options.staging.wait_timeout = absl::Seconds(wait_timeout_s);
  options.keep_disk_steps = keep_disk;
  options.keep_memory_steps = keep_memory;
  options.full_every = full_every;
  options.idle_job_memory_ttl =
      idle_ttl_s > 0 ? absl::Seconds(idle_ttl_s) : absl::InfiniteDuration();
  options.persist_threads = persist_threads;
  options.recycle_files = recycle_files;
  options.writer.codec.zstd_level = zstd_level;
  // Set when a stop runs out of time: the persists in flight then stop at
  // their next chunk.
  std::atomic<bool> cancel_persists{false};
  options.writer.cancel = &cancel_persists;
  if (codec == "none") {
    options.writer.codec.codec = ckpt::proto::CODEC_NONE;
  } else if (codec == "adaptive") {
    const int max_level = std::max(zstd_max_level, zstd_level);
    options.writer.governor = std::make_shared<ckpt::snapshot::CodecGovernor>(
        ckpt::snapshot::CodecGovernorOptions{
            .base_level = zstd_level,
            .max_effort = 1.0 + (max_level - zstd_level)});
  }

  if (!peer_address.empty()) {
    ckpt::daemon::ReplicationOptions& r = options.replication;
    r.node_id = node_id;
    r.failure_domain = failure_domain;
    r.replicas = peer_replicas;
    r.dir = replica_dir.empty() ? staging_dir + ".peer" : replica_dir;
    r.keep_steps = keep_memory;
    if (!ParseBytes(replica_budget, &r.held_budget_bytes)) {
      std::fprintf(stderr,
                   "ckptd: --replica-budget \"%s\" is not a size like 512M "
                   "or 4G\n",
                   replica_budget.c_str());
      return 2;
    }
    r.fetched_budget_bytes = r.held_budget_bytes;
    const int tls_files =
        !tls_ca.empty() + !tls_cert.empty() + !tls_key.empty();
    if (tls_files != 0 && tls_files != 3) {
      std::fprintf(stderr,
                   "ckptd: mutual TLS needs --peer-tls-ca, --peer-tls-cert "
                   "and --peer-tls-key together\n");
      return 2;
    }
    if (tls_files == 3) {
      auto creds = ckpt::daemon::PeerTlsCredentials(tls_ca, tls_cert, tls_key);
      if (!creds.ok()) {
        std::fprintf(stderr, "ckptd: %s\n",
                     std::string(creds.status().message()).c_str());
        return 2;
      }
      r.credentials = *std::move(creds);
    }
    if (coordinator == "embedded") {
      CKPT_LOG_WARN(
          "ckptd: --peer-address without --coordinator etcd://...: no other "
          "node can be found, so nothing is replicated");
    }
  } else if (!tls_ca.empty() || !tls_cert.empty() || !tls_key.empty()) {
    std::fprintf(stderr, "ckptd: --peer-tls-* need --peer-address\n");
    return 2;
  }

  options.shared = {
      .dir = shared_dir, .every = shared_every, .keep = keep_shared};

  // Termination signals are taken synchronously below, after every thread has
  // them blocked.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (coordinator != "embedded") {
    auto endpoints = ckpt::daemon::ParseEtcdUrl(coordinator);
    if (!endpoints.ok()) {
      std::fprintf(stderr, "ckptd: --coordinator: %s\n",
                   std::string(endpoints.status().message()).c_str());
      return 2;
    }
    auto etcd = ckpt::daemon::EtcdCoordinator::Connect(
        {.endpoints = *endpoints,
         .node_id = node_id,
         .lease_ttl = absl::Seconds(lease_ttl_s)});
    if (!etcd.ok()) {
      std::fprintf(stderr, "ckptd: %s\n",
                   std::string(etcd.status().message()).c_str());
      return 1;
    }
    options.coordinator = *std::move(etcd);
  }
  std::unique_ptr<ckpt::io::FaultInjectionFs> faults;
  ckpt::io::FileSystem* fs = ckpt::io::DefaultFileSystem();
  if (fault_injection) {
    faults = std::make_unique<ckpt::io::FaultInjectionFs>(fs);
    faults->ModelDurabilityByJournal();
    fs = faults.get();
    CKPT_LOG_WARN("ckptd: fault injection is on (--fault-injection)");
  }
  auto service = ckpt::daemon::CheckpointService::Start(fs, options);
  if (!service.ok()) {
    std::fprintf(stderr, "ckptd: %s\n",
                 std::string(service.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<ckpt::daemon::MetricsServer> metrics;
  if (!metrics_address.empty()) {
    auto started = ckpt::daemon::MetricsServer::Start(
        (*service)->metrics(), metrics_address, metrics_allow_remote);
    if (!started.ok()) {
      std::fprintf(stderr, "ckptd: %s\n",
                   std::string(started.status().message()).c_str());
      return 1;
    }
    metrics = *std::move(started);
    CKPT_LOG_INFO("ckptd: metrics on http://{}:{}/metrics", metrics->host(),
                  metrics->port());
  }
  std::unique_ptr<ckpt::daemon::PeerServer> peers;
  if ((*service)->replicator() != nullptr) {
    auto started = ckpt::daemon::PeerServer::Start(service->get(),
                                                   (*service)->replicator(),
                                                   {.address = peer_address,
                                                    .tls_ca_file = tls_ca,
                                                    .tls_cert_file = tls_cert,
                                                    .tls_key_file = tls_key});
    if (!started.ok()) {
      std::fprintf(stderr, "ckptd: %s\n",
                   std::string(started.status().message()).c_str());
      return 1;
    }
    peers = *std::move(started);
    (*service)->replicator()->SetAddress(peers->address());
    CKPT_LOG_INFO("ckptd: peer service on {}{} ({} replicas per shard)",
                  peers->address(), tls_ca.empty() ? "" : " with mutual TLS",
                  peer_replicas);
  }
  auto server = ckpt::daemon::LocalApiServer::Start(
      service->get(), {.socket_path = socket_path, .faults = faults.get()});
  if (!server.ok()) {
    std::fprintf(stderr, "ckptd: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  {
    // What `ckpt --data-dir` needs of this daemon: where it listens, and the
    // directories of the tiers beside the data directory.
    std::error_code ec;
    auto absolute = [&ec](const std::string& p) {
      return p.empty() ? p : std::filesystem::absolute(p, ec).string();
    };
    nlohmann::json record;
    record["socket"] = absolute(socket_path);
    record["node_id"] = node_id;
    record["staging_dir"] = absolute(staging_dir);
    record["replica_dir"] = absolute(options.replication.dir);
    record["shared_dir"] = absolute(shared_dir);
    const std::string path = data_dir + "/ckptd.json";
    std::ofstream(path + ".tmp", std::ios::trunc) << record.dump(2) << "\n";
    std::filesystem::rename(path + ".tmp", path, ec);
    if (ec) {
      CKPT_LOG_WARN("ckptd: recording itself in {}: {}", path, ec.message());
    }
  }
  CKPT_LOG_INFO(
      "ckptd: node {} ready: data {}, staging {} (budget {} bytes, policy {})",
      node_id, data_dir, staging_dir, options.staging.budget_bytes, policy);
  const auto notify = ckpt::daemon::SupervisorNotify::FromEnvironment();
  Notify(notify, absl::StrCat("READY=1\nSTATUS=serving ", socket_path));
  absl::Notification stop;
  std::thread watchdog;
  if (notify.watchdog().has_value()) {
    watchdog = std::thread([&notify, &stop, service = service->get()] {
      Watchdog(notify, *service, stop);
    });
  }
  int sig = 0;
  sigwait(&signals, &sig);
  CKPT_LOG_INFO("ckptd: signal {}, shutting down", sig);
  Notify(notify, "STOPPING=1\nSTATUS=finishing the persists in flight");
  stop.Notify();
  if (watchdog.joinable()) watchdog.join();
  absl::Notification stopped;
  std::thread deadline([&stopped, &cancel_persists, stop_timeout_s] {
    StopDeadline(absl::Seconds(stop_timeout_s), cancel_persists, stopped);
  });
  metrics.reset();
  server->reset();
  peers.reset();
  service->reset();
  stopped.Notify();
  deadline.join();
  return 0;
}
