// DaemonSession tells this node's ckptd that a trainer of a job is attached
// (a Checkpointer makes one when state is first registered): it holds an
// Attach call open on its own thread for as long as it lives, and calls again
// after the daemon restarted. ckptd counts a job with no session
// open as idle, so its memory-tier copies that are safe at a durable tier give
// way first when the memory budget is short. A process that dies closes its
// connection, which ends its session without anything to clean up.
//
// Thread-safety: thread-safe (no methods beyond construction and destruction).
#ifndef CKPT_CLIENT_DAEMON_SESSION_H_
#define CKPT_CLIENT_DAEMON_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace ckpt::client {

class DaemonSession {
 public:
  DaemonSession(std::shared_ptr<grpc::Channel> channel, std::string job,
                uint32_t rank);
  // Ends the session (cancels the call) and joins its thread.
  ~DaemonSession();
  DaemonSession(const DaemonSession&) = delete;
  DaemonSession& operator=(const DaemonSession&) = delete;

 private:
  void Run();

  const std::shared_ptr<grpc::Channel> channel_;
  const std::string job_;
  const uint32_t rank_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;  // in flight
  std::thread thread_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_DAEMON_SESSION_H_
