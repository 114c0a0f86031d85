#include "daemon/server/supervisor_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "io/errno_status.h"

namespace ckpt::daemon {

SupervisorNotify SupervisorNotify::FromEnvironment() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  std::optional<absl::Duration> watchdog;
  const char* usec = std::getenv("WATCHDOG_USEC");
  const char* pid = std::getenv("WATCHDOG_PID");
  uint64_t us = 0, for_pid = 0;
  const bool for_us =
      pid == nullptr || (absl::SimpleAtoi(pid, &for_pid) &&
                         for_pid == static_cast<uint64_t>(::getpid()));
  if (usec != nullptr && absl::SimpleAtoi(usec, &us) && us > 0 && for_us)
    watchdog = absl::Microseconds(static_cast<int64_t>(us));
  return SupervisorNotify(socket != nullptr ? socket : "", watchdog);
}

absl::Status SupervisorNotify::Send(absl::string_view state) const {
  if (socket_.empty()) return absl::OkStatus();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_.size() >= sizeof(addr.sun_path) ||
      (socket_[0] != '/' && socket_[0] != '@')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NOTIFY_SOCKET \"", socket_,
        "\" is neither an absolute path nor an abstract name (@...) that fits "
        "a unix socket address"));
  }
  std::memcpy(addr.sun_path, socket_.data(), socket_.size());
  if (socket_[0] == '@') addr.sun_path[0] = '\0';
  const socklen_t len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_.size());
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return io::ErrnoToStatus(errno, "socket for NOTIFY_SOCKET");
  ssize_t sent;
  do {
    sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                    reinterpret_cast<const sockaddr*>(&addr), len);
  } while (sent < 0 && errno == EINTR);
  const int err = errno;
  ::close(fd);
  if (sent < 0) {
    return io::ErrnoToStatus(
        err, absl::StrCat("notifying the supervisor at ", socket_));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::daemon
