// ckptd: the per-node checkpoint daemon (one node, embedded coordination).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/checkpoint_service.h"
#include "daemon/etcd_coordinator.h"
#include "daemon/local_api.h"
#include "daemon/metrics_server.h"
#include "io/logging.h"

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

}  // namespace

int main(int argc, char** argv) {
  const std::string uid = std::to_string(::geteuid());
  std::string socket_path = absl::StrCat("/tmp/ckpt-", uid, "/ckptd.sock");
  std::string data_dir = absl::StrCat("/tmp/ckpt-", uid, "/data");
  std::string staging_dir = absl::StrCat("/dev/shm/ckpt-", uid, "-staging");
  std::string budget = "4G";
  std::string policy = "wait";
  double wait_timeout_s = 60;
  int keep_disk = 2, keep_memory = 1, persist_threads = 2, zstd_level = 1;
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
  app.add_option("--persist-threads", persist_threads,
                 "threads persisting shards")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--zstd-level", zstd_level,
                 "zstd level of the persisted chunks")
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
  bool fault_injection = false;
  app.add_flag("--fault-injection", fault_injection,
               "chaos testing: write through the fault-injecting file system "
               "and accept InjectFaults calls (never in production)");
  CLI11_PARSE(app, argc, argv);

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
  options.persist_threads = persist_threads;
  options.writer.codec.zstd_level = zstd_level;

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
    faults->DisableDurabilityModel();
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
  auto server = ckpt::daemon::LocalApiServer::Start(
      service->get(), {.socket_path = socket_path, .faults = faults.get()});
  if (!server.ok()) {
    std::fprintf(stderr, "ckptd: %s\n",
                 std::string(server.status().message()).c_str());
    return 1;
  }
  CKPT_LOG_INFO(
      "ckptd: node {} ready: data {}, staging {} (budget {} bytes, policy {})",
      node_id, data_dir, staging_dir, options.staging.budget_bytes, policy);
  int sig = 0;
  sigwait(&signals, &sig);
  CKPT_LOG_INFO("ckptd: signal {}, shutting down", sig);
  metrics.reset();
  server->reset();
  service->reset();
  return 0;
}
