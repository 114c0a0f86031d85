// Operators' calls to a node's ckptd over its local socket (what the `ckpt`
// command asks of a running daemon), and the one conversion of gRPC statuses
// into absl::Status that libckpt and these calls share.
//
// Thread-safety: the functions are thread-safe.
#ifndef CKPT_CLIENT_DAEMON_ADMIN_H_
#define CKPT_CLIENT_DAEMON_ADMIN_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/host.h"
#include "proto/daemon.grpc.pb.h"

namespace ckpt::client {

// The gRPC status as an absl::Status (the codes are the same numbers), its
// message prefixed by `what`. An unreachable daemon is named by its socket
// (`socket_path`, when given).
absl::Status FromGrpc(const grpc::Status& s, absl::string_view what,
                      absl::string_view socket_path = "");

// One unary call to the ckptd at `socket_path`, with a deadline.
template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> CallDaemon(const std::string& socket_path,
                                    Method method, const Request& req,
                                    absl::string_view what,
                                    std::chrono::milliseconds timeout) {
  auto stub = proto::CkptDaemon::NewStub(grpc::CreateChannel(
      io::UnixSocketTarget(socket_path), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  Response resp;
  absl::Status s =
      FromGrpc((stub.get()->*method)(&context, req, &resp), what, socket_path);
  if (!s.ok()) return s;
  return resp;
}

// Retention now, through the daemon that owns the catalog.
absl::StatusOr<proto::CollectGarbageResponse> CollectGarbage(
    const std::string& socket_path, const proto::CollectGarbageRequest& req);

// ckpt restore: the daemon makes a committed step what the job (or a fork of
// it) resumes from.
absl::StatusOr<proto::RollBackResponse> RollBack(
    const std::string& socket_path, const proto::RollBackRequest& req);

// The daemon's metrics, Prometheus text format.
absl::StatusOr<std::string> GetMetricsText(const std::string& socket_path);

// Where the daemon at `socket_path` keeps its tiers; Unavailable within
// `timeout` when none answers there.
absl::StatusOr<proto::DescribeResponse> DescribeDaemon(
    const std::string& socket_path,
    std::chrono::milliseconds timeout = std::chrono::seconds(5));

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_DAEMON_ADMIN_H_
