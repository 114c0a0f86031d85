// The one place in ckptd where absl::Status and gRPC statuses convert into each
// other (the codes are the same numbers), for the local API, the peer service
// and the peer client. Every error ckptd returns is marked as its own answer
// (proto DaemonAnswered in the status's details), so a client tells it from a
// transport failure.
//
// Thread-safety: pure functions, callable from any thread.
#ifndef CKPT_DAEMON_COMMON_GRPC_STATUS_H_
#define CKPT_DAEMON_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"
#include "proto/daemon.pb.h"

namespace ckpt::daemon {

// Marked as ckptd's answer (proto DaemonAnswered).
inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()),
                      proto::DaemonAnswered::descriptor()->full_name());
}

// `what` says which call failed and with whom ("pushing ... to node b at
// 10.0.0.2:7070").
inline absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_COMMON_GRPC_STATUS_H_
