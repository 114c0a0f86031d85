// Kill points mark the steps of every commit path so crash tests can stop a
// process exactly there (rocksdb's TEST_KILL_RANDOM idea, made deterministic).
//
//   CKPT_KILL_POINT("shard.after_rename");
//
// A process started with CKPT_KILL_POINT=<name>[:<n>] in its environment raises
// SIGKILL at the n-th (default first) time it reaches that point. In-process
// tests can instead install a callback that sees every point. When neither is
// set the cost is one relaxed atomic load.
//
// Thread-safety: thread-safe.
#ifndef CKPT_IO_KILL_POINT_H_
#define CKPT_IO_KILL_POINT_H_

#include <atomic>
#include <functional>

#include "absl/strings/string_view.h"

namespace ckpt::io {

namespace internal {
extern std::atomic<bool> g_kill_points_armed;
void ReachKillPoint(absl::string_view name);
}  // namespace internal

// Installs (or, with nullptr, removes) a callback invoked at every kill point.
void SetKillPointCallback(std::function<void(absl::string_view)> callback);

}  // namespace ckpt::io

#define CKPT_KILL_POINT(name)                           \
  do {                                                  \
    if (::ckpt::io::internal::g_kill_points_armed.load( \
            std::memory_order_relaxed)) {               \
      ::ckpt::io::internal::ReachKillPoint(name);       \
    }                                                   \
  } while (0)

#endif  // CKPT_IO_KILL_POINT_H_
