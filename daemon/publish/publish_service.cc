#include "daemon/publish/publish_service.h"

#include <algorithm>

#include "absl/time/time.h"
#include "daemon/common/grpc_status.h"

namespace ckpt::daemon {
namespace {

grpc::Status NoPublisher() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "this ckptd does not publish (no publication directory)");
}

// The result as the call's response, or its error.
template <typename T>
grpc::Status Answer(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status PublishService::Publish(grpc::ServerContext*,
                                     const proto::PublishRequest* request,
                                     proto::VersionRecord* response) {
  if (publisher_ == nullptr) return NoPublisher();
  return Answer(publisher_->Publish(*request), response);
}

grpc::Status PublishService::WaitForVersion(
    grpc::ServerContext* context, const proto::WaitForVersionRequest* request,
    proto::VersionRecord* response) {
  if (publisher_ == nullptr) return NoPublisher();
  // Never past the call's own deadline (nor an hour).
  absl::Time deadline =
      absl::Now() + absl::Milliseconds(std::clamp<int64_t>(
                        request->timeout_ms(), 0, int64_t{3600} * 1000));
  deadline = std::min(deadline, absl::FromChrono(context->deadline()));
  return Answer(
      publisher_->WaitForVersion(request->topic(), request->after(), deadline),
      response);
}

grpc::Status PublishService::OpenVersion(
    grpc::ServerContext*, const proto::OpenVersionRequest* request,
    proto::OpenVersionResponse* response) {
  if (publisher_ == nullptr) return NoPublisher();
  return Answer(publisher_->OpenVersion(request->topic(), request->version()),
                response);
}

grpc::Status PublishService::ListTopics(grpc::ServerContext*,
                                        const proto::ListTopicsRequest*,
                                        proto::ListTopicsResponse* response) {
  if (publisher_ == nullptr) return NoPublisher();
  return Answer(publisher_->ListTopics(), response);
}

grpc::Status PublishService::Subscribe(grpc::ServerContext*,
                                       const proto::SubscribeRequest* request,
                                       proto::SubscribeResponse* response) {
  if (publisher_ == nullptr) return NoPublisher();
  absl::StatusOr<bool> added = subscribe_(request->topic());
  if (!added.ok()) return ToGrpc(added.status());
  response->set_already(!*added);
  return grpc::Status::OK;
}

}  // namespace ckpt::daemon
