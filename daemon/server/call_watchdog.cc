#include "daemon/server/call_watchdog.h"

#include <grpcpp/server_context.h>

#include <algorithm>
#include <utility>

#include "io/logging.h"

namespace ckpt::daemon {

CallWatchdog::CallWatchdog(absl::Duration idle) : idle_(idle) {
  thread_ = std::thread([this] { Loop(); });
}

CallWatchdog::~CallWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

std::unique_ptr<CallWatchdog::Watch> CallWatchdog::Start(
    grpc::ServerContext* ctx, std::string what) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  calls_[id] = Call{ctx, std::move(what), absl::Now()};
  return std::unique_ptr<Watch>(new Watch(this, id));
}

CallWatchdog::Watch::~Watch() {
  absl::MutexLock lock(&dog_->mu_);
  dog_->calls_.erase(id_);
}

void CallWatchdog::Watch::Touch() {
  absl::MutexLock lock(&dog_->mu_);
  auto it = dog_->calls_.find(id_);
  if (it != dog_->calls_.end()) it->second.last = absl::Now();
}

uint64_t CallWatchdog::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void CallWatchdog::Loop() {
  const absl::Duration tick =
      std::clamp(idle_ / 4, absl::Milliseconds(50), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), tick)) {
    const absl::Time now = absl::Now();
    for (auto& [id, call] : calls_) {
      if (call.ctx == nullptr || now - call.last <= idle_) continue;
      CKPT_LOG_WARN(
          "peer service: cancelling {} from {}: nothing received for {}",
          call.what, call.ctx->peer(), absl::FormatDuration(now - call.last));
      // Under mu_, so the call cannot end (and its context go) meanwhile:
      // its Watch is destroyed only after it takes mu_.
      call.ctx->TryCancel();
      call.ctx = nullptr;  // once
      ++cancelled_;
    }
  }
}

}  // namespace ckpt::daemon
