// PublishService serves proto::CkptPublish on ckptd's local socket, beside
// CkptDaemon: the calls of `ckpt publish`, the trainer's publish and the
// readers' Subscriber, each handed to the Publisher.
//
// Thread-safety: thread-safe (the Publisher is).
#ifndef CKPT_DAEMON_PUBLISH_PUBLISH_SERVICE_H_
#define CKPT_DAEMON_PUBLISH_PUBLISH_SERVICE_H_

#include "daemon/publish/publisher.h"
#include "proto/publish.grpc.pb.h"

namespace ckpt::daemon {

class PublishService final : public proto::CkptPublish::Service {
 public:
  // `publisher` null: every call is refused (Unavailable).
  explicit PublishService(Publisher* publisher) : publisher_(publisher) {}

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

 private:
  Publisher* const publisher_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PUBLISH_PUBLISH_SERVICE_H_
