#include "daemon/server/instance_dirs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "io/errno_status.h"
#include "io/file_system.h"
#include "io/status_macros.h"

namespace ckpt::daemon {
namespace {

// The pid a lock file records ("unknown" when it holds none).
std::string RecordedPid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  int pid = 0;
  if (n > 0 &&
      absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(buf, n)),
                       &pid)) {
    return absl::StrCat(pid);
  }
  return "unknown";
}

}  // namespace

absl::Status EnsurePrivateDir(const std::string& dir, absl::string_view what) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return io::ErrnoToStatus(errno, absl::StrCat(what, " ", dir));
    }
    RETURN_IF_ERROR(io::DefaultFileSystem()->CreateDirs(dir));
    if (::lstat(dir.c_str(), &st) != 0) {
      return io::ErrnoToStatus(errno, absl::StrCat(what, " ", dir));
    }
  }
  if (S_ISLNK(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " ", dir,
        " is a symlink: ckptd uses only a real directory (give its target)"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " ", dir, " exists and is not a directory"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " ", dir, " is owned by uid ", st.st_uid,
                     ", not ckptd's uid ", ::geteuid(),
                     ": another user could read or replace what ckptd keeps "
                     "there (remove it, or chown it to uid ",
                     ::geteuid(), ")"));
  }
  if ((st.st_mode & 0777) != 0700 && ::chmod(dir.c_str(), 0700) != 0) {
    return io::ErrnoToStatus(errno, absl::StrCat("chmod 0700 ", dir));
  }
  return absl::OkStatus();
}

std::string DefaultDataDir() {
  if (::geteuid() == 0) return "/var/lib/ckpt";
  const char* state = std::getenv("XDG_STATE_HOME");
  if (state != nullptr && state[0] == '/') return absl::StrCat(state, "/ckpt");
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') {
    return absl::StrCat(home, "/.local/state/ckpt");
  }
  return absl::StrCat("/var/tmp/ckpt-", ::geteuid(), "/data");
}

absl::StatusOr<std::unique_ptr<InstanceLock>> InstanceLock::Acquire(
    const std::string& lock_file, absl::string_view what) {
  const int fd = ::open(lock_file.c_str(),
                        O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return io::ErrnoToStatus(errno,
                             absl::StrCat("lock of ", what, " ", lock_file));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string pid = RecordedPid(fd);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " is in use by another ckptd (pid ", pid, ", holding ",
          lock_file, "): one ckptd per directory and socket"));
    }
    return io::ErrnoToStatus(err, absl::StrCat("flock ", lock_file));
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) !=
                                     static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(fd);
    return io::ErrnoToStatus(err,
                             absl::StrCat("recording the pid in ", lock_file));
  }
  return std::unique_ptr<InstanceLock>(new InstanceLock(fd));
}

InstanceLock::~InstanceLock() { ::close(fd_); }

absl::StatusOr<std::vector<std::unique_ptr<InstanceLock>>> ClaimInstanceDirs(
    const InstanceDirs& dirs) {
  std::vector<std::unique_ptr<InstanceLock>> locks;
  RETURN_IF_ERROR(EnsurePrivateDir(dirs.data_dir, "data directory"));
  ASSIGN_OR_RETURN(
      locks.emplace_back(),
      InstanceLock::Acquire(io::JoinPath(dirs.data_dir, "ckptd.lock"),
                            absl::StrCat("data directory ", dirs.data_dir)));
  RETURN_IF_ERROR(EnsurePrivateDir(dirs.staging_dir, "staging directory"));
  ASSIGN_OR_RETURN(locks.emplace_back(),
                   InstanceLock::Acquire(
                       io::JoinPath(dirs.staging_dir, ".ckptd.lock"),
                       absl::StrCat("staging directory ", dirs.staging_dir)));
  if (!dirs.replica_dir.empty()) {
    RETURN_IF_ERROR(EnsurePrivateDir(dirs.replica_dir, "replica directory"));
  }
  // The socket's directory is checked when the socket is made; its lock
  // lies beside it, so that no second daemon replaces a live socket.
  RETURN_IF_ERROR(
      io::DefaultFileSystem()->CreateDirs(io::DirName(dirs.socket_path)));
  ASSIGN_OR_RETURN(
      locks.emplace_back(),
      InstanceLock::Acquire(dirs.socket_path + ".lock",
                            absl::StrCat("socket ", dirs.socket_path)));
  return locks;
}

}  // namespace ckpt::daemon
