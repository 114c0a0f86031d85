// MetricsServer serves ckptd's Metrics at GET /metrics in the Prometheus text
// format over HTTP (cpp-httplib), on its own thread. It listens only on a
// loopback address unless the operator allows others: the figures name jobs
// and paths, and the endpoint has no authentication.
//
// Thread-safety: Start and the destructor from one thread.
#ifndef CKPT_DAEMON_SERVER_METRICS_SERVER_H_
#define CKPT_DAEMON_SERVER_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/common/metrics.h"

namespace httplib {
class Server;
}

namespace ckpt::daemon {

class MetricsServer {
 public:
  // `address` is HOST:PORT; port 0 picks a free one (see port()).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      Metrics* metrics, const std::string& address, bool allow_remote);
  ~MetricsServer();

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_METRICS_SERVER_H_
