#include "daemon/server/ckptd_flags.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/server/instance_dirs.h"
#include "daemon/server/peer_service.h"
#include "daemon/server/shared_tier_flags.h"
#include "io/host.h"
#include "io/logging.h"
#include "io/rate_limiter.h"
#include "io/status_macros.h"
#include "snapshot/erasure_code.h"
#include "snapshot/format.h"
#include "snapshot/names.h"

namespace ckpt::daemon {
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

// Without TLS, the peer service (and its bulk transfers) is plaintext and
// unauthenticated: only on loopback, or where the operator says the network
// is trusted.
absl::Status CheckPlaintextPeers(const CkptdFlags& f) {
  absl::StatusOr<std::string> host = io::HostOfAddress(f.peer_address);
  if (!host.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer-address: ", host.status().message()));
  }
  if (io::IsLoopbackHost(*host)) return absl::OkStatus();
  if (!f.peer_insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--peer-address ", f.peer_address,
        " is reachable from other hosts and peer TLS is off: anyone who "
        "reaches it could read, forge and delete checkpoints. Give "
        "--peer-tls-ca, --peer-tls-cert and --peer-tls-key (tools/ckpt-certs "
        "makes a CA and a certificate per node), or --peer-insecure on a "
        "network whose every host is trusted"));
  }
  CKPT_LOG_WARN(
      "ckptd: --peer-insecure: the peer service on {} runs without TLS; "
      "anyone who reaches it can read, forge and delete checkpoints",
      f.peer_address);
  return absl::OkStatus();
}

// The defaults that depend on the user and the host.
void SetDefaults(CkptdFlags& f) {
  const std::string uid = std::to_string(::geteuid());
  // $CKPT_SOCKET, as trainers and ckpt read it, else the uid's default.
  const char* socket_env = std::getenv("CKPT_SOCKET");
  f.socket_path = socket_env != nullptr && socket_env[0] != '\0'
                      ? std::string(socket_env)
                      : absl::StrCat("/tmp/ckpt-", uid, "/ckptd.sock");
  f.data_dir = DefaultDataDir();
  f.staging_dir = absl::StrCat("/dev/shm/ckpt-", uid, "-staging");
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) f.node_id = host;
}

// This node: its socket, directories, memory tier, persists and codec.
void AddLocalOptions(CLI::App& app, CkptdFlags& f) {
  app.add_option("--socket", f.socket_path,
                 "unix socket of the local API (its directory becomes 0700)")
      ->capture_default_str();
  app.add_option("--data-dir", f.data_dir, "catalog and persisted shards")
      ->capture_default_str();
  app.add_option("--staging-dir", f.staging_dir,
                 "memory tier: staging slots (use tmpfs)")
      ->capture_default_str();
  app.add_option("--memory-budget", f.budget,
                 "bytes of staging slots, e.g. 512M, 4G")
      ->capture_default_str();
  app.add_option("--full-policy", f.policy,
                 "when the budget is exhausted: wait or skip")
      ->check(CLI::IsMember({"wait", "skip"}))
      ->capture_default_str();
  app.add_option("--wait-timeout", f.wait_timeout_s,
                 "seconds the wait policy waits")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--keep-disk", f.keep_disk,
                 "committed steps kept on local disk")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--keep-memory", f.keep_memory,
                 "committed steps kept in memory")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_flag("--persist-newest", f.persist_newest,
               "when saves come faster than the disk takes them, persist "
               "each rank's newest waiting save only: the older ones stay "
               "committed in memory but never reach the disk (saving every "
               "step)");
  app.add_option("--full-every", f.full_every,
                 "incremental saves: every Nth save of a rank stores every "
                 "chunk, the others only what changed since the rank's last "
                 "save; 1: every save is full")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--idle-job-memory-ttl", f.idle_ttl_s,
                 "seconds after its last trainer detached (and its last "
                 "save) that a job gives up its memory-tier copies that are "
                 "safe on disk or at peers; 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--trainer-hung-after", f.trainer_hung_after_s,
                 "seconds a rank's session may stay open without a save (and "
                 "at least ten of the job's save intervals) before it counts "
                 "as a hung trainer (ckpt_failures_total{cause=\"trainer_hung"
                 "\"}); 0: never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--xor-deltas", f.xor_deltas,
                 "incremental saves: a changed float chunk is stored as the "
                 "XOR with the same chunk of the rank's previous save when "
                 "that is smaller and the previous save is still in memory "
                 "(shard format 5); restores then decode the chain")
      ->capture_default_str();
  app.add_option("--xor-max-depth", f.xor_max_depth,
                 "XOR deltas a restore from disk decodes per chunk, at most "
                 "(a chunk whose previous save is that deep is stored as it "
                 "is)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--recycle-files", f.recycle_files,
                 "shard files retired by garbage collection that are kept for "
                 "the next persists to write over (0: delete them)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--persist-threads", f.persist_threads,
                 "threads persisting shards")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--background-nice", f.background_nice,
                 "how much lower the persist, codec, replication and copy "
                 "threads are scheduled than the rest (nice increment; 0: "
                 "the same), so that trainers copying their state get the "
                 "cores first")
      ->check(CLI::Range(0, 19))
      ->capture_default_str();
  app.add_option("--zstd-level", f.zstd_level,
                 "zstd level of the persisted chunks")
      ->check(CLI::Range(-7, 19))
      ->capture_default_str();
  app.add_option("--codec", f.codec,
                 "adaptive: compress (byte-shuffle + zstd) as much as the "
                 "disk's speed allows, storing chunks raw whenever the disk "
                 "would otherwise wait for the compressor; zstd: compress "
                 "every chunk that shrinks; none: store every chunk raw")
      ->check(CLI::IsMember({"adaptive", "zstd", "none"}))
      ->capture_default_str();
  app.add_option("--zstd-max-level", f.zstd_max_level,
                 "adaptive codec: the highest zstd level it may raise chunks "
                 "to while the disk is the bottleneck (at least --zstd-level; "
                 "level 1 and this at 1 never raise it)")
      ->check(CLI::Range(-7, 19))
      ->capture_default_str();
  app.add_option("--shard-format", f.shard_format,
                 "shard file format to write: 5 (XOR deltas of changed float "
                 "chunks), or 4 (byte-plane coded chunks) or 3 while some node "
                 "still runs a ckptd that reads only those")
      ->check(
          CLI::Range(static_cast<int>(snapshot::kOldestWrittenFormatVersion),
                     static_cast<int>(snapshot::kFormatVersion)))
      ->capture_default_str();
}

// Who this node is, its metrics, its coordinator (etcd and its TLS and
// auth), the cluster key.
void AddCoordinationOptions(CLI::App& app, CkptdFlags& f) {
  app.add_option("--node-id", f.node_id, "this node's name")
      ->capture_default_str();
  app.add_option("--metrics-address", f.metrics_address,
                 "serve Prometheus metrics at http://HOST:PORT/metrics (off "
                 "when empty; port 0 picks one)");
  app.add_flag("--metrics-allow-remote", f.metrics_allow_remote,
               "allow a non-loopback --metrics-address");
  app.add_option("--coordinator", f.coordinator,
                 "embedded (one node), or etcd://host:port[,host:port...]")
      ->capture_default_str();
  app.add_option("--etcd-ca", f.etcd_ca,
                 "TLS to etcd: PEM file of the CA that signed etcd's server "
                 "certificate (etcd's https:// client URLs)");
  app.add_option("--etcd-cert", f.etcd_cert,
                 "TLS to etcd: this node's client certificate (PEM), for "
                 "etcd's --client-cert-auth (with auth on, its common name is "
                 "the etcd user)");
  app.add_option("--etcd-key", f.etcd_key, "TLS to etcd: its key (PEM)");
  app.add_option("--etcd-user", f.etcd_user,
                 "etcd auth: the user ckptd authenticates as");
  app.add_option("--etcd-password-file", f.etcd_password_file,
                 "etcd auth: a file (mode 0600) whose first line is the "
                 "user's password");
  app.add_flag("--etcd-insecure", f.etcd_insecure,
               "reach etcd endpoints off loopback without TLS: anyone on the "
               "path could forge votes and commits (only on a trusted "
               "network); warned at every start");
  app.add_option("--cluster-key", f.cluster_key,
                 "every shard's manifest is sealed with the cluster key (a "
                 "keyed MAC), and shards whose seal it does not check are "
                 "refused at every tier. Unset: the cluster's own key, made "
                 "by the first ckptd and kept in the coordinator (etcd, or "
                 "the embedded one). A file (mode 0600) of at least 32 bytes "
                 "shared by every node (tools/ckpt-certs cluster-key makes "
                 "one): that key. \"none\": no seals (warned at every "
                 "start)");
  app.add_option("--cluster-key-old", f.cluster_key_old,
                 "during a key rotation: a previous cluster key, accepted "
                 "for reading (repeatable)");
  app.add_option("--lease-ttl", f.lease_ttl_s,
                 "seconds without keep-alive before etcd declares this node "
                 "dead (it is then fenced until it rejoins)")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
}

// Tier T1: replicas or parity on peers, and the peer service's TLS.
void AddPeerOptions(CLI::App& app, CkptdFlags& f) {
  app.add_option("--peer-address", f.peer_address,
                 "HOST:PORT of this node's peer service (port 0 picks one): "
                 "turns on peer replication (tier T1) and restores from peers; "
                 "needs --coordinator etcd://... to find the other nodes");
  app.add_option("--peer-replicas", f.peer_replicas,
                 "K: peers that keep a replica of each persisted shard")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  app.add_option("--peer-redundancy", f.peer_redundancy,
                 "rs:K+M: instead of full replicas, protect each group of K "
                 "nodes' shards with M parity blocks on M other nodes "
                 "(Reed-Solomon): any M nodes may be lost, for M/K of the "
                 "state in peer memory; every node needs the same setting");
  app.add_option("--reprotect-delay", f.reprotect_delay_s,
                 "seconds from a node's loss to making again what it held "
                 "(replicas, parity, lost shards rebuilt on stand-ins): the "
                 "restores that follow a loss have the network and the cores "
                 "first; 0 re-protects at once")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--failure-domain", f.failure_domain,
                 "this node's failure domain (rack, switch): replicas go to "
                 "other domains first");
  app.add_option("--replica-dir", f.replica_dir,
                 "tmpfs directory for the replicas held for peers and the "
                 "copies fetched from them (default: <staging-dir>.peer)");
  app.add_option("--replica-budget", f.replica_budget,
                 "bytes of replicas held for peers, e.g. 512M, 4G (fetched "
                 "copies get as much again)")
      ->capture_default_str();
  app.add_option("--peer-tls-ca", f.tls_ca,
                 "mutual TLS between peers: PEM file of the CA that signs "
                 "every node's certificate");
  app.add_option("--peer-tls-cert", f.tls_cert,
                 "mutual TLS: this node's certificate (PEM)");
  app.add_option("--peer-tls-key", f.tls_key,
                 "mutual TLS: this node's private key (PEM)");
  app.add_flag("--peer-insecure", f.peer_insecure,
               "run the peer service without TLS on a non-loopback "
               "--peer-address: anyone who reaches the port can then read, "
               "forge and delete checkpoints (only for a network every host "
               "of which is trusted); warned at every start");
  app.add_option("--peer-send-rate", f.peer_send_rate,
                 "bytes per second this node sends to its peers at most, "
                 "e.g. 256M (replicas, parity, copies served, published "
                 "versions alike), so checkpoint traffic cannot starve the "
                 "job's own collectives; default: uncapped");
  app.add_option("--peer-idle-timeout", f.peer_idle_timeout_s,
                 "seconds a peer's push or fetch may stay without progress "
                 "before it is cancelled and what it reserved is released")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
}

// Tier T3, publication, fault injection, the stop.
void AddSharedAndRunOptions(CLI::App& app, CkptdFlags& f) {
  AddSharedTierOptions(app, f);
  app.add_option("--publish-dir", f.publish_dir,
                 "tmpfs directory of the published versions this node holds "
                 "(ckpt publish; default: <staging-dir>.publish; \"none\": "
                 "no publication)");
  app.add_option("--publish-budget", f.publish_budget,
                 "memory the published versions this node holds may take, "
                 "e.g. 8G (every topic's, with those being made or arriving; "
                 "a version that does not fit is refused)")
      ->capture_default_str();
  app.add_option("--keep-versions", f.keep_versions,
                 "published versions of each topic this node keeps (readers "
                 "that opened an older one keep reading it)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--subscribe", f.subscribe,
                 "subscribe to a published topic: fetch each new version "
                 "from the peers as it is published, and forward it to the "
                 "subscribers below this node (repeat for more topics; needs "
                 "--peer-address); config: subscribe = [\"policy\"]");
  app.add_option("--fanout-degree", f.fanout_degree,
                 "subscribers each node forwards a version to: 1 is a chain "
                 "(each byte sent once per node), more a tree; 0 chooses (a "
                 "chain unless there are more subscribers than 1 MiB pieces "
                 "in the version)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--subscribe-stall", f.subscribe_stall_s,
                 "seconds a subscriber waits for the next piece from a peer "
                 "before it fetches from the next one (routing around a "
                 "dead or stuck node)")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app.add_flag("--fault-injection", f.fault_injection,
               "chaos testing: write through the fault-injecting file system "
               "and accept InjectFaults calls (never in production)");
  app.add_option("--stop-timeout", f.stop_timeout_s,
                 "on SIGTERM, seconds to let the persists in flight finish; "
                 "then they stop at their next chunk, their temporary files "
                 "are removed and their shards stay staged for the next start")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
}

// --config and --print-config.
void AddConfigOptions(CLI::App& app, CkptdFlags& f) {
  app.set_config("--config", "",
                 "read settings from this TOML file: one `key = value` per "
                 "long option (memory-budget = \"8G\", peer-replicas = 2, "
                 "fault-injection = false); options on the command line win; "
                 "unknown keys are refused")
      ->check(CLI::ExistingFile);
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.add_flag("--print-config", f.print_config,
               "print the effective settings (defaults, --config file and "
               "options) as a config file, then exit")
      ->configurable(false);
}

// nullopt when parsed; else the exit code (help, or an error said).
std::optional<int> Parse(CLI::App& app, int argc, char** argv) {
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
    return std::optional<int>(2);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, or the error
    return std::optional<int>(rc == 0 ? 0 : 2);
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> ParseCkptdFlags(int argc, char** argv, CkptdFlags& f) {
  SetDefaults(f);
  CLI::App app{"ckptd: the ckpt checkpoint daemon of this node"};
  AddLocalOptions(app, f);
  AddCoordinationOptions(app, f);
  AddPeerOptions(app, f);
  AddSharedAndRunOptions(app, f);
  AddConfigOptions(app, f);
  if (std::optional<int> rc = Parse(app, argc, argv)) return rc;
  if (f.print_config) {
    std::cout << app.config_to_str(/*default_also=*/true,
                                   /*write_description=*/true);
    return std::optional<int>(0);
  }
  return std::nullopt;
}

absl::StatusOr<EtcdOptions> EtcdOptionsFrom(const CkptdFlags& f) {
  EtcdOptions o;
  ASSIGN_OR_RETURN(o.endpoints, ParseEtcdUrl(f.coordinator));
  o.node_id = f.node_id;
  o.lease_ttl = absl::Seconds(f.lease_ttl_s);
  o.ca_file = f.etcd_ca;
  o.cert_file = f.etcd_cert;
  o.key_file = f.etcd_key;
  o.user = f.etcd_user;
  o.password_file = f.etcd_password_file;
  if (o.user.empty() != o.password_file.empty()) {
    return absl::InvalidArgumentError(
        "--etcd-user and --etcd-password-file go together");
  }
  if (!o.ca_file.empty()) return o;
  std::vector<std::string> remote;
  for (const std::string& e : o.endpoints) {
    absl::StatusOr<std::string> host = io::HostOfAddress(e);
    if (!host.ok() || !io::IsLoopbackHost(*host)) remote.push_back(e);
  }
  if (remote.empty()) return o;
  if (!o.user.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd-user without --etcd-ca would send the password in plaintext "
        "to ",
        absl::StrJoin(remote, ", "), ": give --etcd-ca"));
  }
  if (!f.etcd_insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd at ", absl::StrJoin(remote, ", "),
        " would be reached without TLS: anyone on the path could forge votes "
        "and commits (and make retention delete real shards). Give --etcd-ca "
        "(and --etcd-cert/--etcd-key or --etcd-user/--etcd-password-file), or "
        "--etcd-insecure on a network whose every host is trusted"));
  }
  CKPT_LOG_WARN("ckptd: --etcd-insecure: etcd at {} is reached without TLS",
                absl::StrJoin(remote, ", "));
  return o;
}

// --subscribe and its settings; --peer-send-rate.
absl::Status SubscriptionsFrom(const CkptdFlags& f, ServiceOptions& options) {
  if (!f.peer_send_rate.empty()) {
    uint64_t rate = 0;
    if (!ParseBytes(f.peer_send_rate, &rate)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer-send-rate \"", f.peer_send_rate,
                       "\" is not a rate in bytes per second (e.g. 256M)"));
    }
    if (f.peer_address.empty()) {
      return absl::InvalidArgumentError(
          "--peer-send-rate caps sends to peers: it needs --peer-address");
    }
    options.replication.send_rate = std::make_shared<io::RateLimiter>(rate);
  }
  // For --subscribe's topics and those `ckpt subscribe` adds.
  options.subscription.node_id = f.node_id;
  options.subscription.degree = f.fanout_degree;
  options.subscription.stall = absl::Seconds(f.subscribe_stall_s);
  if (f.subscribe.empty()) return absl::OkStatus();
  if (f.peer_address.empty()) {
    return absl::InvalidArgumentError(
        "--subscribe needs --peer-address: a subscriber fetches versions "
        "from its peers");
  }
  if (options.publish.dir.empty()) {
    return absl::InvalidArgumentError(
        "--subscribe needs publication on (not --publish-dir none): the "
        "versions received are kept there");
  }
  for (const std::string& topic : f.subscribe) {
    if (absl::Status valid = snapshot::ValidateTopic(topic); !valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--subscribe: ", valid.message()));
    }
  }
  options.subscribe = f.subscribe;
  return absl::OkStatus();
}

absl::StatusOr<ServiceOptions> ServiceOptionsFrom(const CkptdFlags& f) {
  ServiceOptions options;
  options.data_dir = f.data_dir;
  options.staging.dir = f.staging_dir;
  if (!ParseBytes(f.budget, &options.staging.budget_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--memory-budget \"", f.budget, "\" is not a size like 512M or 4G"));
  }
  options.staging.policy =
      f.policy == "skip" ? FullPolicy::kSkip : FullPolicy::kWait;
  options.staging.wait_timeout = absl::Seconds(f.wait_timeout_s);
  options.keep_disk_steps = f.keep_disk;
  options.keep_memory_steps = f.keep_memory;
  options.persist_newest = f.persist_newest;
  options.full_every = f.full_every;
  options.agree_cluster_key = f.cluster_key.empty();
  options.node_id = f.node_id;
  options.idle_job_memory_ttl =
      f.idle_ttl_s > 0 ? absl::Seconds(f.idle_ttl_s) : absl::InfiniteDuration();
  options.trainer_hung_after = f.trainer_hung_after_s > 0
                                   ? absl::Seconds(f.trainer_hung_after_s)
                                   : absl::InfiniteDuration();
  options.persist_threads = f.persist_threads;
  options.recycle_files = f.recycle_files;
  options.writer.xor_deltas = f.xor_deltas;
  options.writer.max_delta_depth = static_cast<uint32_t>(f.xor_max_depth);
  options.writer.codec.zstd_level = f.zstd_level;
  options.writer.codec.format_version = static_cast<uint32_t>(f.shard_format);
  if (f.codec == "none") {
    options.writer.codec.codec = proto::CODEC_NONE;
  } else if (f.codec == "adaptive") {
    const int max_level = std::max(f.zstd_max_level, f.zstd_level);
    options.writer.governor = std::make_shared<snapshot::CodecGovernor>(
        snapshot::CodecGovernorOptions{
            .base_level = f.zstd_level,
            .max_effort = 1.0 + (max_level - f.zstd_level)});
  }
  const int tls_files =
      !f.tls_ca.empty() + !f.tls_cert.empty() + !f.tls_key.empty();
  if (!f.peer_address.empty()) {
    ReplicationOptions& r = options.replication;
    r.node_id = f.node_id;
    r.failure_domain = f.failure_domain;
    r.replicas = f.peer_replicas;
    r.dir = f.replica_dir.empty() ? f.staging_dir + ".peer" : f.replica_dir;
    r.keep_steps = f.keep_memory;
    r.reprotect_delay = absl::Seconds(f.reprotect_delay_s);
    if (!ParseBytes(f.replica_budget, &r.held_budget_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--replica-budget \"", f.replica_budget,
                       "\" is not a size like 512M or 4G"));
    }
    r.fetched_budget_bytes = r.held_budget_bytes;
    if (!f.peer_redundancy.empty()) {
      ASSIGN_OR_RETURN(snapshot::ErasureCode code,
                       snapshot::ErasureCode::Parse(f.peer_redundancy));
      ParityOptions& p = options.parity;
      p.node_id = f.node_id;
      p.failure_domain = f.failure_domain;
      p.k = code.k();
      p.m = code.m();
      p.budget_bytes = r.held_budget_bytes;
      r.replicas = 0;  // parity instead of full replicas
    }
    if (tls_files != 0 && tls_files != 3) {
      return absl::InvalidArgumentError(
          "mutual TLS needs --peer-tls-ca, --peer-tls-cert and --peer-tls-key "
          "together");
    }
    if (tls_files == 3) {
      ASSIGN_OR_RETURN(r.credentials,
                       PeerTlsCredentials(f.tls_ca, f.tls_cert, f.tls_key));
    } else {
      RETURN_IF_ERROR(CheckPlaintextPeers(f));
    }
    if (f.coordinator == "embedded") {
      CKPT_LOG_WARN(
          "ckptd: --peer-address without --coordinator etcd://...: no other "
          "node can be found, so nothing is replicated");
    }
  } else if (tls_files != 0) {
    return absl::InvalidArgumentError("--peer-tls-* need --peer-address");
  } else if (!f.peer_redundancy.empty()) {
    return absl::InvalidArgumentError("--peer-redundancy needs --peer-address");
  }
  RETURN_IF_ERROR(ApplySharedTierFlags(f, &options.shared));
  // Landed copies may take as much memory again as the staging slots.
  options.shared.landing_budget_bytes = options.staging.budget_bytes;
  if (f.publish_dir != "none") {
    options.publish.dir =
        f.publish_dir.empty() ? f.staging_dir + ".publish" : f.publish_dir;
    options.publish.keep_versions = f.keep_versions;
    options.publish.node_id = f.node_id;
    if (!ParseBytes(f.publish_budget, &options.publish.budget_bytes) ||
        options.publish.budget_bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--publish-budget \"", f.publish_budget,
                       "\" is not a size like 512M or 4G"));
    }
  }
  RETURN_IF_ERROR(SubscriptionsFrom(f, options));
  return options;
}

}  // namespace ckpt::daemon
