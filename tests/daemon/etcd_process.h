// A real etcd (Debian's etcd-server) for the tests: its own data directory and
// loopback ports; SIGKILL and restart on the same data, SIGSTOP/SIGCONT.
#ifndef CKPT_TESTS_DAEMON_ETCD_PROCESS_H_
#define CKPT_TESTS_DAEMON_ETCD_PROCESS_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"
#include "tools/process.h"

namespace ckpt::testing {

class EtcdProcess {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";

  EtcdProcess()
      : client_port_(tools::FreeLoopbackPort()),
        peer_port_(tools::FreeLoopbackPort()) {}
  ~EtcdProcess() { Kill(); }

  std::string endpoint() const {
    return "127.0.0.1:" + std::to_string(client_port_);
  }
  std::string log() const { return ReadAll(dir_.File("etcd.log")); }

  // Starts etcd and waits until it accepts TCP connections; false if it
  // exits or does not listen within 20 s.
  bool Start() {
    if (::access(kBinary, X_OK) != 0) return false;
    pid_ = ::fork();
    if (pid_ == 0) {
      int log = ::open(dir_.File("etcd.log").c_str(),
                       O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(log, 1);
      ::dup2(log, 2);
      const std::string client = "http://" + endpoint();
      const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
      std::vector<std::string> args = {kBinary,
                                       "--name",
                                       "ckpt-test",
                                       "--data-dir",
                                       dir_.File("data"),
                                       "--listen-client-urls",
                                       client,
                                       "--advertise-client-urls",
                                       client,
                                       "--listen-peer-urls",
                                       peer,
                                       "--initial-advertise-peer-urls",
                                       peer,
                                       "--initial-cluster",
                                       "ckpt-test=" + peer};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(kBinary, argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 800; ++i) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      if (Listening()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }

  bool Listening() const {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(client_port_);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
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

 private:
  TempDir dir_;
  const int client_port_, peer_port_;
  pid_t pid_ = -1;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_DAEMON_ETCD_PROCESS_H_
