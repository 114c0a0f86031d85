#include "client/daemon_admin.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "io/status_macros.h"
#include "proto/daemon.grpc.pb.h"

namespace ckpt::client {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what,
                      absl::string_view socket_path) {
  if (s.ok()) return absl::OkStatus();
  // UNAVAILABLE from the transport: no daemon answered.
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
      s.error_details() != proto::DaemonAnswered::descriptor()->full_name()) {
    return absl::UnavailableError(absl::StrCat(
        what, ": ckptd", socket_path.empty() ? "" : " at ", socket_path,
        " is unreachable (stopped or restarting?): ", s.error_message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

absl::StatusOr<proto::CollectGarbageResponse> CollectGarbage(
    const std::string& socket_path, const proto::CollectGarbageRequest& req) {
  return CallDaemon<proto::CollectGarbageRequest,
                    proto::CollectGarbageResponse>(
      socket_path, &proto::CkptDaemon::Stub::CollectGarbage, req,
      "collecting garbage", std::chrono::minutes(5));
}

absl::StatusOr<proto::RollBackResponse> RollBack(
    const std::string& socket_path, const proto::RollBackRequest& req) {
  return CallDaemon<proto::RollBackRequest, proto::RollBackResponse>(
      socket_path, &proto::CkptDaemon::Stub::RollBack, req, "restoring",
      std::chrono::minutes(5));
}

absl::StatusOr<std::string> GetMetricsText(const std::string& socket_path) {
  ASSIGN_OR_RETURN(
      proto::GetMetricsResponse resp,
      (CallDaemon<proto::GetMetricsRequest, proto::GetMetricsResponse>(
          socket_path, &proto::CkptDaemon::Stub::GetMetrics, {},
          "reading metrics", std::chrono::seconds(10))));
  return resp.text();
}

absl::StatusOr<proto::DescribeResponse> DescribeDaemon(
    const std::string& socket_path, std::chrono::milliseconds timeout) {
  return CallDaemon<proto::DescribeRequest, proto::DescribeResponse>(
      socket_path, &proto::CkptDaemon::Stub::Describe, {},
      "asking ckptd where its data is", timeout);
}

}  // namespace ckpt::client
