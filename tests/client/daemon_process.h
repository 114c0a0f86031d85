// Runs a real ckptd process for integration tests: its own socket, data and
// tmpfs staging directories, its log in a file; SIGKILL and restart on demand.
#ifndef CKPT_TESTS_CLIENT_DAEMON_PROCESS_H_
#define CKPT_TESTS_CLIENT_DAEMON_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace ckpt::testing {

class DaemonProcess {
 public:
  explicit DaemonProcess(std::vector<std::string> extra_args = {})
      : extra_args_(std::move(extra_args)) {
    staging_ = "/dev/shm/ckpt-test-staging-" + std::to_string(::getpid()) +
               "-" + std::to_string(counter_++);
  }
  ~DaemonProcess() {
    Kill();
    std::error_code ec;
    std::filesystem::remove_all(staging_, ec);
    std::filesystem::remove_all(staging_ + ".peer", ec);
    std::filesystem::remove_all(staging_ + ".publish", ec);
  }

  // The flags of the next Start (a restart with other settings).
  void set_extra_args(std::vector<std::string> args) {
    extra_args_ = std::move(args);
  }

  std::string socket() const {
    return socket_.empty() ? dir_.File("run/ckptd.sock") : socket_;
  }
  std::string data_dir() const {
    return data_dir_.empty() ? dir_.File("data") : data_dir_;
  }
  // Another daemon's directories or socket (for tests of what may be shared).
  void UseSocket(std::string path) { socket_ = std::move(path); }
  void UseDataDir(std::string path) { data_dir_ = std::move(path); }
  void UseStagingDir(std::string path) { staging_ = std::move(path); }
  pid_t pid() const { return pid_; }
  // Waits (at most `seconds`) for the process to exit; false if it still
  // runs.
  bool WaitExit(int seconds) {
    for (int i = 0; pid_ > 0 && i < seconds * 40; ++i) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        exit_status_ = status;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return pid_ <= 0;
  }
  const std::string& staging_dir() const { return staging_; }
  // ckptd's default --replica-dir.
  std::string replica_dir() const { return staging_ + ".peer"; }
  std::string log() const { return ReadAll(dir_.File("ckptd.log")); }

  // Starts ckptd and waits until its socket accepts; returns false (with the
  // log) if it exits.
  bool Start() {
    // $CKPT_TEST_CKPTD: a ckptd elsewhere than the build's (the binaries
    // tools/gpu-check.sh carries to a GPU machine).
    const char* forced = std::getenv("CKPT_TEST_CKPTD");
    const std::string binary =
        forced != nullptr && forced[0] != '\0' ? forced : CKPTD;
    pid_ = ::fork();
    if (pid_ == 0) {
      int log = ::open(dir_.File("ckptd.log").c_str(),
                       O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(log, 1);
      ::dup2(log, 2);
      std::vector<std::string> args = {
          binary,     "--socket",      socket(), "--data-dir",
          data_dir(), "--staging-dir", staging_};
      if (std::find(extra_args_.begin(), extra_args_.end(),
                    "--memory-budget") == extra_args_.end()) {
        args.insert(args.end(), {"--memory-budget", "256M"});
      }
      args.insert(args.end(), extra_args_.begin(), extra_args_.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(binary.c_str(), argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 400; ++i) {
      if (Accepting()) return true;
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        exit_status_ = status;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }

  // True when something listens on the socket (a stale socket file refuses).
  bool Accepting() const {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket().c_str(), sizeof(addr.sun_path) - 1);
    bool ok =
        ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    return ok;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // The node is lost with everything it had: SIGKILL, then its data, staging
  // and replica directories are deleted.
  void Lose() {
    Kill();
    std::error_code ec;
    std::filesystem::remove_all(data_dir(), ec);
    std::filesystem::remove_all(staging_, ec);
    std::filesystem::remove_all(replica_dir(), ec);
  }

  // Sends `signal` (SIGSTOP, SIGCONT, ...) without waiting.
  void Signal(int signal) {
    if (pid_ > 0) ::kill(pid_, signal);
  }

  // SIGTERM and wait: a clean shutdown.
  int Stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  int exit_status() const { return exit_status_; }
  const TempDir& dir() const { return dir_; }

 private:
  static inline int counter_ = 0;
  TempDir dir_;
  std::string staging_;
  std::string socket_, data_dir_;  // empty: in dir_
  std::vector<std::string> extra_args_;
  pid_t pid_ = -1;
  int exit_status_ = 0;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_CLIENT_DAEMON_PROCESS_H_
