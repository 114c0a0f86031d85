// ckptd's settings: every command-line option (and key of a --config TOML
// file) with its default and help, and the ServiceOptions they make. Kept
// apart from ckptd_main.cc, which runs the daemon with them.
#ifndef CKPT_DAEMON_SERVER_CKPTD_FLAGS_H_
#define CKPT_DAEMON_SERVER_CKPTD_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/coord/etcd_coordinator.h"
#include "daemon/service/checkpoint_service.h"
#include "snapshot/format.h"

namespace ckpt::daemon {

struct CkptdFlags {
  // Defaults that depend on the user and host are set by ParseCkptdFlags.
  std::string socket_path, data_dir, staging_dir, node_id;
  std::string budget = "4G";
  std::string policy = "wait";
  double wait_timeout_s = 60;
  int keep_disk = 2, keep_memory = 1, persist_threads = 2, zstd_level = 1;
  bool persist_newest = false;
  int background_nice = 0;
  int recycle_files = 2;
  int full_every = 10;
  bool xor_deltas = true;
  int xor_max_depth = 4;
  std::string metrics_address;
  bool metrics_allow_remote = false;
  double idle_ttl_s = 600;
  double trainer_hung_after_s = 600;
  std::string codec = "adaptive";
  int zstd_max_level = 1;
  // The shard format persists write (snapshot/FORMAT.md).
  int shard_format = static_cast<int>(snapshot::kFormatVersion);
  std::string coordinator = "embedded";
  // etcd's TLS and auth (EtcdOptions), and plaintext off loopback.
  std::string etcd_ca, etcd_cert, etcd_key, etcd_user, etcd_password_file;
  bool etcd_insecure = false;
  // Manifest seals (snapshot/manifest_seal.h): the key, and old ones.
  std::string cluster_key;
  std::vector<std::string> cluster_key_old;
  double lease_ttl_s = 10;
  std::string peer_address, failure_domain, replica_dir, replica_budget = "1G";
  std::string tls_ca, tls_cert, tls_key;
  // Peer service without TLS on a non-loopback address (a trusted network).
  bool peer_insecure = false;
  double peer_idle_timeout_s = 30;
  int peer_replicas = 1;
  double reprotect_delay_s = 10;
  std::string peer_redundancy;
  std::string shared_dir;
  std::string shared_uri;  // s3://bucket/prefix, or a directory
  uint64_t shared_every = 1;
  int keep_shared = 2;
  std::string s3_endpoint;
  std::string s3_region = "us-east-1";
  bool s3_path_style = true;
  std::string s3_profile;
  std::string s3_credentials_file;
  uint64_t s3_part_mib = 16;
  int s3_concurrency = 8;
  std::string publish_dir, publish_budget = "4G";
  int keep_versions = 2;
  std::vector<std::string> subscribe;
  int fanout_degree = 0;
  double subscribe_stall_s = 5;
  std::string peer_send_rate;  // bytes/s; empty: uncapped
  bool fault_injection = false;
  double stop_timeout_s = 60;
  bool print_config = false;
};

// Parses the command line (and the --config file it names) into `f`.
// Returns the exit code when ckptd must exit now: 0 after --help or
// --print-config, 2 after printing what was wrong; nullopt to run.
std::optional<int> ParseCkptdFlags(int argc, char** argv, CkptdFlags& f);

// The service's options from the flags: sizes parsed, the codec and its
// governor, replication and its TLS credentials, the shared tier.
// InvalidArgument names the flag that is wrong. The coordinator and the
// writer's cancel flag are left to the caller.
absl::StatusOr<ServiceOptions> ServiceOptionsFrom(const CkptdFlags& f);

// The etcd coordinator's options from the flags (--coordinator etcd://...):
// endpoints, TLS and auth. InvalidArgument when an endpoint off loopback
// would be reached in plaintext without --etcd-insecure, or a password would.
absl::StatusOr<EtcdOptions> EtcdOptionsFrom(const CkptdFlags& f);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_CKPTD_FLAGS_H_
