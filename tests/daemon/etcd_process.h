// A real etcd (Debian's etcd-server) for the tests: its own data directory and
// loopback ports; SIGKILL and restart on the same data, SIGSTOP/SIGCONT.
#ifndef CKPT_TESTS_DAEMON_ETCD_PROCESS_H_
#define CKPT_TESTS_DAEMON_ETCD_PROCESS_H_

#include <signal.h>

#include <string>

#include "tests/test_util.h"
#include "tools/process.h"

namespace ckpt::testing {

class EtcdProcess {
 public:
  static constexpr const char* kBinary = tools::LocalEtcd::kBinary;

  EtcdProcess() : etcd_(dir_.path()) {}

  std::string endpoint() const { return etcd_.endpoint(); }
  std::string log() const { return ReadAll(etcd_.log_path()); }

  // Starts etcd and waits until it accepts TCP connections; false if it
  // exits or does not listen within 20 s.
  bool Start() { return etcd_.Start(); }
  bool Listening() const {
    const std::string e = etcd_.endpoint();
    return tools::ListeningOnLoopback(std::stoi(e.substr(e.rfind(':') + 1)));
  }
  void Kill() { etcd_.Kill(); }
  pid_t pid() const { return etcd_.pid(); }

 private:
  TempDir dir_;
  tools::LocalEtcd etcd_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_DAEMON_ETCD_PROCESS_H_
