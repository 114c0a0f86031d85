// PeerServer is ckptd's peer API (proto/peer.proto) over TCP: it takes the
// replicas other nodes push here (into the Replicator's ReplicaStore, verified
// before they count) and serves this node's copies of shards to nodes that
// restore them: a replica held in memory first, else the owner's shard file.
// With TLS files it requires mutual TLS: a client without a certificate, or
// with one no CA in `tls_ca_file` signed, is refused at the handshake.
// Without, it also runs a BulkServer on the same host, which sends offered
// shard files over plain TCP (the fast path of restores from peers). With the
// erasure-coded peer tier, it also takes the parity contributions data nodes
// push (into the ParityStore) and serves complete parity blocks. It serves
// the published versions this node holds or is receiving to subscribers
// (daemon/publish/subscriptions.h). Every send draws on the send cap. What a
// peer may push is PeerAuthorization's to say (peer_authorization.h). Limits:
// at most `max_calls` calls at once, and a push or fetch idle for
// `idle_timeout` is cancelled, releasing what it reserved.
//
// Thread-safety: thread-safe; calls run on gRPC's threads.
#ifndef CKPT_DAEMON_SERVER_PEER_SERVICE_H_
#define CKPT_DAEMON_SERVER_PEER_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/peer/parity_store.h"
#include "daemon/peer/replicator.h"
#include "daemon/server/call_watchdog.h"
#include "daemon/service/checkpoint_service.h"
#include "io/bulk_transfer.h"
#include "io/file_system.h"
#include "io/rate_limiter.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace ckpt::daemon {

struct PeerServerOptions {
  // host:port to listen on; port 0 picks a free one (see port()).
  std::string address;
  // PEM files; all three or none.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  int max_message_bytes = 8 << 20;
  // A push or fetch that receives or sends nothing this long is cancelled
  // (call_watchdog.h).
  absl::Duration idle_timeout = absl::Seconds(30);
  // Calls served at once (server threads); more are refused.
  int max_calls = 64;
  // Every byte sent to peers draws on it (--peer-send-rate; null: uncapped).
  io::RateLimiter* send_rate = nullptr;
  // How long a peer's read of a version still arriving here waits for a
  // piece before it fails (and the peer asks another node).
  absl::Duration version_stall = absl::Seconds(5);
};

class PeerServer {
 public:
  // `parity`: the parity blocks this node holds (null: no erasure-coded
  // peer tier here; pushes of parity are refused). `fs`: where the copies it
  // serves are read (ckptd's, fault injection included).
  static absl::StatusOr<std::unique_ptr<PeerServer>> Start(
      CheckpointService* service, Replicator* replicator, ParityStore* parity,
      io::FileSystem* fs, const PeerServerOptions& options);
  // Cancels calls in flight (an unfinished push leaves nothing).
  ~PeerServer();

  int port() const { return port_; }
  // The address to publish: the host of --peer-address with the bound port.
  const std::string& address() const { return address_; }

 private:
  PeerServer() = default;

  Replicator* replicator_ = nullptr;
  std::shared_ptr<io::BulkServer> bulk_;    // shared with the replicator
  std::unique_ptr<CallWatchdog> watchdog_;  // outlives service_'s calls
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_PEER_SERVICE_H_
