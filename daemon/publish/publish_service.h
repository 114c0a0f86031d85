// PublishService serves proto::CkptPublish on ckptd's local socket, beside
// CkptDaemon: the calls of `ckpt publish`, the trainer's publish and the
// readers' Subscriber, each handed to the Publisher; `ckpt subscribe`.
//
// Thread-safety: thread-safe (the Publisher is).
#ifndef CKPT_DAEMON_PUBLISH_PUBLISH_SERVICE_H_
#define CKPT_DAEMON_PUBLISH_PUBLISH_SERVICE_H_

#include <functional>
#include <string>

#include "daemon/publish/publisher.h"
#include "proto/publish.grpc.pb.h"

namespace ckpt::daemon {

class PublishService final : public proto::CkptPublish::Service {
 public:
  // Makes this node a subscriber of a topic (false: it was one already).
  using SubscribeFn = std::function<absl::StatusOr<bool>(const std::string&)>;
  // `publisher` null: every call is refused (Unavailable).
  PublishService(Publisher* publisher, SubscribeFn subscribe)
      : publisher_(publisher), subscribe_(std::move(subscribe)) {}

  grpc::Status Publish(grpc::ServerContext* context,
                       const proto::PublishRequest* request,
                       proto::VersionRecord* response) override;
  grpc::Status WaitForVersion(grpc::ServerContext* context,
                              const proto::WaitForVersionRequest* request,
                              proto::VersionRecord* response) override;
  grpc::Status OpenVersion(grpc::ServerContext* context,
                           const proto::OpenVersionRequest* request,
                           proto::OpenVersionResponse* response) override;
  grpc::Status ListTopics(grpc::ServerContext* context,
                          const proto::ListTopicsRequest* request,
                          proto::ListTopicsResponse* response) override;
  grpc::Status Subscribe(grpc::ServerContext* context,
                         const proto::SubscribeRequest* request,
                         proto::SubscribeResponse* response) override;

 private:
  Publisher* const publisher_;
  const SubscribeFn subscribe_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PUBLISH_PUBLISH_SERVICE_H_
