#include "io/background.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "io/errno_status.h"
#include "io/logging.h"

namespace ckpt::io {
namespace {

std::atomic<int> background_nice{0};
std::atomic<bool> refusal_logged{false};

}  // namespace

void SetBackgroundNice(int increment) {
  background_nice = std::clamp(increment, 0, 19);
}

int BackgroundNice() { return background_nice; }

void EnterBackground() {
  const int increment = background_nice;
  if (increment == 0) return;
  const id_t tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if ((now == -1 && errno != 0) ||
      ::setpriority(PRIO_PROCESS, tid, std::min(19, now + increment)) != 0) {
    if (!refusal_logged.exchange(true)) {
      CKPT_LOG_WARN("background threads keep their priority: {}",
                    ErrnoToStatus(errno, "setpriority").ToString());
    }
  }
}

}  // namespace ckpt::io
