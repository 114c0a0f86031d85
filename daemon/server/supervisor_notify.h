// SupervisorNotify tells a service manager how ckptd is doing, through
// systemd's notification protocol (sd_notify(3)): one datagram per message,
// "KEY=VALUE" lines, sent to the AF_UNIX socket named by $NOTIFY_SOCKET (a
// path, or an abstract name written with a leading '@'). systemd documents the
// protocol as stable and meant to be spoken without libsystemd; speaking it
// here keeps ckptd free of a libsystemd dependency on nodes (containers) that
// do not run systemd at all.
//
// Without $NOTIFY_SOCKET every call does nothing and succeeds, so ckptd
// behaves the same under a terminal, Kubernetes or systemd's Type=simple.
//
// Thread-safety: thread-safe (each message is one sendmsg).
#ifndef CKPT_DAEMON_SERVER_SUPERVISOR_NOTIFY_H_
#define CKPT_DAEMON_SERVER_SUPERVISOR_NOTIFY_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckpt::daemon {

class SupervisorNotify {
 public:
  // Reads $NOTIFY_SOCKET, and $WATCHDOG_USEC (with $WATCHDOG_PID, when set,
  // naming this process) for the watchdog.
  static SupervisorNotify FromEnvironment();
  // For tests.
  SupervisorNotify(std::string socket, std::optional<absl::Duration> watchdog)
      : socket_(std::move(socket)), watchdog_(watchdog) {}

  bool enabled() const { return !socket_.empty(); }
  // How often the supervisor wants WATCHDOG=1 at the latest; nullopt when it
  // wants none.
  std::optional<absl::Duration> watchdog() const { return watchdog_; }

  // Sends `state`, e.g. "READY=1\nSTATUS=serving", "WATCHDOG=1",
  // "STOPPING=1".
  absl::Status Send(absl::string_view state) const;

 private:
  std::string socket_;
  std::optional<absl::Duration> watchdog_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_SUPERVISOR_NOTIFY_H_
