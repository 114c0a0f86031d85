#include "io/kill_point.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::io {
namespace {

struct KillState {
  absl::Mutex mu;
  std::string target ABSL_GUARDED_BY(mu);
  int remaining ABSL_GUARDED_BY(mu) = 0;
  std::function<void(absl::string_view)> callback ABSL_GUARDED_BY(mu);
};

KillState& State() {
  static KillState* state = new KillState;
  return *state;
}

bool ArmFromEnvironment() {
  const char* spec = std::getenv("CKPT_KILL_POINT");
  if (spec == nullptr || *spec == '\0') return false;
  absl::string_view s(spec);
  int count = 1;
  size_t colon = s.rfind(':');
  if (colon != absl::string_view::npos &&
      absl::SimpleAtoi(s.substr(colon + 1), &count)) {
    s = s.substr(0, colon);
  }
  KillState& state = State();
  absl::MutexLock l(&state.mu);
  state.target = std::string(s);
  state.remaining = count < 1 ? 1 : count;
  return true;
}

}  // namespace

namespace internal {
std::atomic<bool> g_kill_points_armed{ArmFromEnvironment()};

void ReachKillPoint(absl::string_view name) {
  KillState& state = State();
  std::function<void(absl::string_view)> callback;
  {
    absl::MutexLock l(&state.mu);
    callback = state.callback;
    if (!state.target.empty() && state.target == name &&
        --state.remaining == 0) {
      ::kill(::getpid(), SIGKILL);
      ::pause();
    }
  }
  if (callback) callback(name);
}
}  // namespace internal

void SetKillPointCallback(std::function<void(absl::string_view)> callback) {
  KillState& state = State();
  absl::MutexLock l(&state.mu);
  state.callback = std::move(callback);
  internal::g_kill_points_armed.store(state.callback != nullptr ||
                                      !state.target.empty());
}

}  // namespace ckpt::io
