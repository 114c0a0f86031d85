// ckptd: the per-node checkpoint daemon.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/coord/etcd_coordinator.h"
#include "daemon/server/ckptd_flags.h"
#include "daemon/server/instance_dirs.h"
#include "daemon/server/local_api.h"
#include "daemon/server/metrics_server.h"
#include "daemon/server/peer_service.h"
#include "daemon/server/supervisor_notify.h"
#include "daemon/service/checkpoint_service.h"
#include "io/background.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "nlohmann/json.hpp"
#include "snapshot/manifest_seal.h"

namespace {

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

// --cluster-key FILE (and its rotation's old keys), installed for the
// process; "none" warns; unset leaves the key to the service, which agrees
// on the cluster's own through the coordinator.
absl::Status InstallClusterKeyFile(const ckpt::daemon::CkptdFlags& f) {
  const bool file = !f.cluster_key.empty() && f.cluster_key != "none";
  if (!f.cluster_key_old.empty() && !file) {
    return absl::InvalidArgumentError(
        "--cluster-key-old needs --cluster-key FILE");
  }
  if (f.cluster_key == "none") {
    CKPT_LOG_WARN(
        "ckptd: manifests are not sealed (--cluster-key none): whoever can "
        "write a tier, or reach the peer port as a node of the cluster, can "
        "forge shards");
  }
  if (!file) return absl::OkStatus();
  auto keys = ckpt::snapshot::SealKeys::Load(f.cluster_key, f.cluster_key_old);
  if (!keys.ok()) {
    return absl::Status(
        keys.status().code(),
        absl::StrCat("--cluster-key: ", keys.status().message()));
  }
  CKPT_LOG_INFO("ckptd: manifests sealed with cluster key {}{}",
                (*keys)->current_id(),
                f.cluster_key_old.empty()
                    ? ""
                    : absl::StrCat(" (", f.cluster_key_old.size(),
                                   " old keys accepted for reads)"));
  ckpt::snapshot::InstallSealKeys(*std::move(keys));
  return absl::OkStatus();
}

// Says why ckptd cannot start; returns `code`, its exit code.
int Fail(const absl::Status& status, int code) {
  std::fprintf(stderr, "ckptd: %s\n", std::string(status.message()).c_str());
  return code;
}

// What `ckpt --data-dir` needs of this daemon: where it listens, and the
// directories of the tiers beside the data directory.
void RecordSelf(ckpt::io::FileSystem* fs, const ckpt::daemon::CkptdFlags& f,
                const std::string& replica_dir) {
  std::error_code ec;
  auto absolute = [&ec](const std::string& p) {
    return p.empty() ? p : std::filesystem::absolute(p, ec).string();
  };
  nlohmann::json record;
  record["socket"] = absolute(f.socket_path);
  record["node_id"] = f.node_id;
  record["staging_dir"] = absolute(f.staging_dir);
  record["replica_dir"] = absolute(replica_dir);
  record["shared_dir"] = absolute(f.shared_dir);
  const std::string path = f.data_dir + "/ckptd.json";
  absl::Status recorded =
      ckpt::io::ReplaceFileDurably(fs, path, record.dump(2) + "\n");
  if (!recorded.ok()) {
    CKPT_LOG_WARN("ckptd: recording itself in {}: {}", path,
                  recorded.ToString());
  }
}

// The daemon's parts, started in this order and stopped in reverse (the
// servers before the service they call).
class Daemon {
 public:
  explicit Daemon(const ckpt::daemon::CkptdFlags& f) : f_(f) {}

  // Any error: ckptd exits 1.
  absl::Status Start(ckpt::daemon::ServiceOptions options) {
    if (f_.fault_injection) {
      faults_ = std::make_unique<ckpt::io::FaultInjectionFs>(fs_);
      faults_->ModelDurabilityByJournal();
      fs_ = faults_.get();
      CKPT_LOG_WARN("ckptd: fault injection is on (--fault-injection)");
    }
    const std::string replica_dir = options.replication.dir;
    ASSIGN_OR_RETURN(service_, ckpt::daemon::CheckpointService::Start(
                                   fs_, std::move(options)));
    RETURN_IF_ERROR(StartMetrics());
    RETURN_IF_ERROR(StartPeers());
    ASSIGN_OR_RETURN(
        server_, ckpt::daemon::LocalApiServer::Start(
                     service_.get(),
                     {.socket_path = f_.socket_path, .faults = faults_.get()}));
    RecordSelf(fs_, f_, replica_dir);
    return absl::OkStatus();
  }

  const ckpt::daemon::CheckpointService& service() const { return *service_; }

  void Stop() {
    metrics_.reset();
    server_.reset();
    peers_.reset();
    service_.reset();
  }

 private:
  absl::Status StartMetrics() {
    if (f_.metrics_address.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(metrics_, ckpt::daemon::MetricsServer::Start(
                                   service_->metrics(), f_.metrics_address,
                                   f_.metrics_allow_remote));
    CKPT_LOG_INFO("ckptd: metrics on http://{}:{}/metrics", metrics_->host(),
                  metrics_->port());
    return absl::OkStatus();
  }

  absl::Status StartPeers() {
    if (service_->replicator() == nullptr) return absl::OkStatus();
    ckpt::daemon::ParityStore* parity =
        service_->parity() != nullptr ? service_->parity()->store() : nullptr;
    ASSIGN_OR_RETURN(
        peers_, ckpt::daemon::PeerServer::Start(
                    service_.get(), service_->replicator(), parity, fs_,
                    {.address = f_.peer_address,
                     .tls_ca_file = f_.tls_ca,
                     .tls_cert_file = f_.tls_cert,
                     .tls_key_file = f_.tls_key,
                     .idle_timeout = absl::Seconds(f_.peer_idle_timeout_s),
                     .send_rate = service_->replicator()->send_rate(),
                     .version_stall = absl::Seconds(f_.subscribe_stall_s)}));
    service_->replicator()->SetAddress(peers_->address());
    CKPT_LOG_INFO("ckptd: peer service on {}{} ({})", peers_->address(),
                  f_.tls_ca.empty() ? "" : " with mutual TLS",
                  parity != nullptr
                      ? absl::StrCat(service_->parity()->code().ToString(),
                                     " parity per group of shards")
                      : absl::StrCat(f_.peer_replicas, " replicas per shard"));
    return absl::OkStatus();
  }

  const ckpt::daemon::CkptdFlags& f_;
  std::unique_ptr<ckpt::io::FaultInjectionFs> faults_;
  ckpt::io::FileSystem* fs_ = ckpt::io::DefaultFileSystem();
  std::unique_ptr<ckpt::daemon::CheckpointService> service_;
  std::unique_ptr<ckpt::daemon::MetricsServer> metrics_;
  std::unique_ptr<ckpt::daemon::PeerServer> peers_;
  std::unique_ptr<ckpt::daemon::LocalApiServer> server_;
};

// Serves until SIGTERM or SIGINT (blocked in every thread, taken here),
// telling the supervisor, and feeding its watchdog while the service is live.
void ServeUntilSignalled(const Daemon& daemon, const sigset_t& signals,
                         const std::string& socket_path) {
  const auto notify = ckpt::daemon::SupervisorNotify::FromEnvironment();
  Notify(notify, absl::StrCat("READY=1\nSTATUS=serving ", socket_path));
  absl::Notification stop;
  std::thread watchdog;
  if (notify.watchdog().has_value()) {
    watchdog = std::thread([&notify, &stop, &daemon] {
      Watchdog(notify, daemon.service(), stop);
    });
  }
  int sig = 0;
  sigwait(&signals, &sig);
  CKPT_LOG_INFO("ckptd: signal {}, shutting down", sig);
  Notify(notify, "STOPPING=1\nSTATUS=finishing the persists in flight");
  stop.Notify();
  if (watchdog.joinable()) watchdog.join();
}

}  // namespace

int main(int argc, char** argv) {
  // A crash leaves its signal and stack on stderr (the daemon's log under a
  // supervisor or ckpt-chaos), not a silent exit.
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler(absl::FailureSignalHandlerOptions());
  // A peer that hangs up mid-write is an error on that write, not the end of
  // the daemon.
  ::signal(SIGPIPE, SIG_IGN);
  ckpt::daemon::CkptdFlags f;
  if (std::optional<int> exit_code =
          ckpt::daemon::ParseCkptdFlags(argc, argv, f)) {
    return *exit_code;
  }
  absl::StatusOr<ckpt::daemon::ServiceOptions> made =
      ckpt::daemon::ServiceOptionsFrom(f);
  if (!made.ok()) return Fail(made.status(), 2);
  ckpt::daemon::ServiceOptions options = *std::move(made);
  ckpt::io::SetBackgroundNice(f.background_nice);
  // Everything ckptd creates is its uid's alone: files 0600, directories
  // 0700 (trainers run as the same uid; see docs/security.md).
  ::umask(077);
  // Before anything is read or removed there: a second daemon on the same
  // directories or socket stops here, and the first's slots stay.
  auto claimed =
      ckpt::daemon::ClaimInstanceDirs({.data_dir = f.data_dir,
                                       .staging_dir = f.staging_dir,
                                       .socket_path = f.socket_path,
                                       .replica_dir = options.replication.dir});
  if (!claimed.ok()) return Fail(claimed.status(), 1);
  // Set when a stop runs out of time: the persists in flight then stop at
  // their next chunk.
  std::atomic<bool> cancel_persists{false};
  options.writer.cancel = &cancel_persists;

  // Termination signals are taken synchronously by ServeUntilSignalled,
  // after every thread has them blocked.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (absl::Status keys = InstallClusterKeyFile(f); !keys.ok()) {
    return Fail(keys, 2);
  }
  if (f.coordinator != "embedded") {
    auto etcd_options = ckpt::daemon::EtcdOptionsFrom(f);
    if (!etcd_options.ok()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
                      "--coordinator: ", etcd_options.status().message())),
                  2);
    }
    auto etcd = ckpt::daemon::EtcdCoordinator::Connect(*etcd_options);
    if (!etcd.ok()) return Fail(etcd.status(), 1);
    options.coordinator = *std::move(etcd);
  }
  const uint64_t budget = options.staging.budget_bytes;
  Daemon daemon(f);
  if (absl::Status started = daemon.Start(std::move(options)); !started.ok()) {
    return Fail(started, 1);
  }
  CKPT_LOG_INFO(
      "ckptd: node {} ready: data {}, staging {} (budget {} bytes, policy {})",
      f.node_id, f.data_dir, f.staging_dir, budget, f.policy);
  ServeUntilSignalled(daemon, signals, f.socket_path);
  absl::Notification stopped;
  std::thread deadline(
      [&stopped, &cancel_persists, stop_timeout_s = f.stop_timeout_s] {
        StopDeadline(absl::Seconds(stop_timeout_s), cancel_persists, stopped);
      });
  daemon.Stop();
  stopped.Notify();
  deadline.join();
  return 0;
}
