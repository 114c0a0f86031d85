#include "client/daemon_admin.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "proto/daemon.grpc.pb.h"

namespace ckpt::client {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what,
                      absl::string_view socket_path) {
  if (s.ok()) return absl::OkStatus();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrCat(
        what, ": ckptd", socket_path.empty() ? "" : " at ", socket_path,
        " is unreachable (stopped or restarting?): ", s.error_message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

absl::StatusOr<proto::CollectGarbageResponse> CollectGarbage(
    const std::string& socket_path, const proto::CollectGarbageRequest& req) {
  auto stub = proto::CkptDaemon::NewStub(
      grpc::CreateChannel(absl::StrCat("unix://", socket_path),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::minutes(5));
  proto::CollectGarbageResponse resp;
  absl::Status s = FromGrpc(stub->CollectGarbage(&context, req, &resp),
                            "collecting garbage", socket_path);
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<std::string> GetMetricsText(const std::string& socket_path) {
  auto stub = proto::CkptDaemon::NewStub(
      grpc::CreateChannel(absl::StrCat("unix://", socket_path),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  proto::GetMetricsResponse resp;
  absl::Status s = FromGrpc(stub->GetMetrics(&context, {}, &resp),
                            "reading metrics", socket_path);
  if (!s.ok()) return s;
  return resp.text();
}

}  // namespace ckpt::client
