// LocalApiServer exposes a CheckpointService to the trainers of this node: gRPC
// over a unix socket. The socket lives in a directory of mode 0700 and has mode
// 0600; the server accepts connections itself so it can check every peer's uid
// with SO_PEERCRED and refuse (and log) any uid other than its own before gRPC
// sees a byte. An existing socket path that is not a socket (a planted symlink,
// a file) is never followed or replaced. Messages are bounded.
//
// Thread-safety: thread-safe; gRPC calls run on gRPC's threads.
#ifndef CKPT_DAEMON_SERVER_LOCAL_API_H_
#define CKPT_DAEMON_SERVER_LOCAL_API_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/service/checkpoint_service.h"
#include "io/fault_injection_fs.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace ckpt::daemon {

struct LocalApiOptions {
  std::string socket_path;
  int max_message_bytes = 64 << 20;
  // The file system the service writes through when ckptd runs with
  // --fault-injection; InjectFaults is refused without it.
  io::FaultInjectionFs* faults = nullptr;
};

class LocalApiServer {
 public:
  static absl::StatusOr<std::unique_ptr<LocalApiServer>> Start(
      CheckpointService* service, const LocalApiOptions& options);
  // Stops accepting, cancels calls in flight and removes the socket.
  ~LocalApiServer();

  // Connections refused because of their uid (for tests and metrics).
  int refused_connections() const { return refused_.load(); }

 private:
  LocalApiServer() = default;
  void AcceptLoop();

  std::string socket_path_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Service> publish_;  // PublishService
  std::unique_ptr<grpc::Server> server_;
  std::thread acceptor_;
  std::atomic<int> refused_{0};
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_LOCAL_API_H_
