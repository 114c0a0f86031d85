#include "daemon/server/metrics_server.h"

#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "io/host.h"

namespace ckpt::daemon {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    Metrics* metrics, const std::string& address, bool allow_remote) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address,
                     "\" is not HOST:PORT (e.g. 127.0.0.1:9464)"));
  }
  const std::string host = io::BareHost(address.substr(0, colon));
  if (!io::IsLoopbackHost(host) && !allow_remote) {
    return absl::PermissionDeniedError(absl::StrCat(
        "metrics address ", address,
        " is not a loopback address; the endpoint has no authentication, so "
        "ckptd serves it elsewhere only with --metrics-allow-remote"));
  }
  std::unique_ptr<MetricsServer> s(new MetricsServer);
  s->server_ = std::make_unique<httplib::Server>();
  // Only GETs are served: a request body, a slow client or a kept-alive
  // connection costs bounded memory and time.
  s->server_->set_payload_max_length(4096);
  s->server_->set_read_timeout(5, 0);
  s->server_->set_write_timeout(5, 0);
  s->server_->set_keep_alive_max_count(16);
  s->server_->set_keep_alive_timeout(5);
  s->server_->Get(
      "/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics->Render(), "text/plain; version=0.0.4");
      });
  s->host_ = host;
  if (port == 0) {
    s->port_ = s->server_->bind_to_any_port(host);
  } else {
    s->port_ = s->server_->bind_to_port(host, port) ? port : -1;
  }
  if (s->port_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, " for metrics"));
  }
  s->thread_ =
      std::thread([srv = s->server_.get()] { srv->listen_after_bind(); });
  return s;
}

MetricsServer::~MetricsServer() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ckpt::daemon
