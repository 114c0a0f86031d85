// CallWatchdog cancels peer calls that stop making progress. A peer that
// opens a push, announces a size and then sends nothing would otherwise hold
// the room reserved for it (and a server thread) for as long as it keeps the
// stream open. A call is watched while it runs: each message it receives
// touches it, and once it has been idle longer than `idle` the watchdog
// cancels it (grpc::ServerContext::TryCancel): its pending Read returns false,
// the call fails CANCELLED and what it reserved is released.
//
// Thread-safety: thread-safe; one thread of its own checks once a second.
#ifndef CKPT_DAEMON_SERVER_CALL_WATCHDOG_H_
#define CKPT_DAEMON_SERVER_CALL_WATCHDOG_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class ServerContext;
}  // namespace grpc

namespace ckpt::daemon {

class CallWatchdog {
 public:
  explicit CallWatchdog(absl::Duration idle);
  ~CallWatchdog();  // stops watching (calls in flight are left alone)

  // Watches `ctx` (described by `what` in the log) until destroyed.
  class Watch {
   public:
    ~Watch();
    // The call made progress (a message arrived).
    void Touch();

   private:
    friend class CallWatchdog;
    Watch(CallWatchdog* dog, uint64_t id) : dog_(dog), id_(id) {}
    CallWatchdog* const dog_;
    const uint64_t id_;
  };
  std::unique_ptr<Watch> Start(grpc::ServerContext* ctx, std::string what);

  // Calls cancelled for being idle so far.
  uint64_t cancelled() const;

 private:
  struct Call {
    grpc::ServerContext* ctx;
    std::string what;
    absl::Time last;
  };
  void Loop();

  const absl::Duration idle_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Call> calls_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_CALL_WATCHDOG_H_
