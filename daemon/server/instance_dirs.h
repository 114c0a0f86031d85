// The directories a ckptd owns, made safe before it touches them: each is a
// real directory (not a symlink) owned by ckptd's uid and private (0700), and
// each is locked to one daemon. A second ckptd given the same data or staging
// directory, or the same socket, would otherwise delete the first one's slots
// at start or take its socket over; it is refused with the running one's pid.
//
// Locks are flock(2)s on a file in the directory, held for the process's
// life: the kernel drops them when the process dies, SIGKILL included, so a
// crashed daemon never leaves a stale lock behind.
//
// Thread-safety: functions are thread-safe; an InstanceLock is not shared.
#ifndef CKPT_DAEMON_SERVER_INSTANCE_DIRS_H_
#define CKPT_DAEMON_SERVER_INSTANCE_DIRS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::daemon {

// Creates `dir` (and missing parents) when it does not exist, then checks
// with lstat that it is a directory, not a symlink, owned by this process's
// effective uid, and makes it 0700. PermissionDenied names the directory,
// `what` it is for ("staging directory") and what is wrong with it.
absl::Status EnsurePrivateDir(const std::string& dir, absl::string_view what);

// The data directory when none is given: /var/lib/ckpt for root, else
// $XDG_STATE_HOME/ckpt or ~/.local/state/ckpt (never under /tmp, where
// another user could create it first).
std::string DefaultDataDir();

class InstanceLock {
 public:
  // Takes the exclusive lock on `lock_file` (created 0600), recording this
  // process's pid in it. FailedPrecondition when another process holds it:
  // the message names `what` is locked and the holder's pid.
  static absl::StatusOr<std::unique_ptr<InstanceLock>> Acquire(
      const std::string& lock_file, absl::string_view what);
  ~InstanceLock();  // releases the lock (the file stays)

  InstanceLock(const InstanceLock&) = delete;
  InstanceLock& operator=(const InstanceLock&) = delete;

 private:
  explicit InstanceLock(int fd) : fd_(fd) {}
  const int fd_;
};

// What one ckptd holds: its data and staging directories made private and
// locked, and its socket's lock (`<socket>.lock`, beside the socket).
struct InstanceDirs {
  std::string data_dir;
  std::string staging_dir;
  std::string socket_path;
  // The peer tier's replicas (empty: none); made private, locked by the
  // staging directory's lock.
  std::string replica_dir;
};
absl::StatusOr<std::vector<std::unique_ptr<InstanceLock>>> ClaimInstanceDirs(
    const InstanceDirs& dirs);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_INSTANCE_DIRS_H_
