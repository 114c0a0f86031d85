// A real etcd (Debian's etcd-server) for the tests: its own data directory and
// loopback ports; SIGKILL and restart on the same data, SIGSTOP/SIGCONT. As a
// deployment runs it unless a test asks otherwise: TLS (a CA and certificate
// from tools/ckpt-certs) and etcd's auth on; a ckptd reaches it with
// DaemonArgs().
#ifndef CKPT_TESTS_DAEMON_ETCD_PROCESS_H_
#define CKPT_TESTS_DAEMON_ETCD_PROCESS_H_

#include <signal.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/test_util.h"
#include "tools/process.h"

namespace ckpt::testing {

class EtcdProcess {
 public:
  static constexpr const char* kBinary = tools::LocalEtcd::kBinary;

  EtcdProcess()
      : tls_(true),
        etcd_(dir_.path(), tools::LocalEtcd::Secured{CKPT_CERTS_TOOL}) {}
  // Plaintext and no auth: for what only such an etcd shows.
  struct Plain {};
  explicit EtcdProcess(Plain) : etcd_(dir_.path()) {}
  // TLS as given, auth off until EnableAuth.
  explicit EtcdProcess(tools::LocalEtcd::Tls tls)
      : tls_(!tls.cert_file.empty()), etcd_(dir_.path(), std::move(tls)) {}

  // Turns etcd's auth on (etcdctl, given `tls_flags` such as "--cacert
  // ca.pem" for an https etcd): a root user, and `user` with `password`
  // allowed to read and write /ckpt/ only.
  bool EnableAuth(const std::string& tls_flags, const std::string& user,
                  const std::string& password) {
    const std::string etcdctl = absl::StrCat(
        "ETCDCTL_API=3 timeout 20 etcdctl --endpoints ",
        tls_ ? "https://" : "http://", endpoint(), " ", tls_flags, " ");
    const std::vector<std::string> steps = {
        "user add root:root-" + password,
        "user grant-role root root",
        absl::StrCat("user add ", user, ":", password),
        "role add ckptd",
        "role grant-permission ckptd --prefix=true readwrite /ckpt/",
        absl::StrCat("user grant-role ", user, " ckptd"),
        "auth enable"};
    for (const std::string& step : steps) {
      const std::string cmd =
          absl::StrCat(etcdctl, step, " >>", dir_.File("etcdctl.log"), " 2>&1");
      if (std::system(cmd.c_str()) != 0) return false;
    }
    return true;
  }

  std::string endpoint() const { return etcd_.endpoint(); }
  // ckptd's flags to reach it (--coordinator etcd://..., and the CA, user
  // and password file of a secured one).
  std::vector<std::string> DaemonArgs() const { return etcd_.DaemonArgs(); }
  std::string ca_file() const { return etcd_.ca_file(); }
  std::string user() const { return etcd_.user(); }
  std::string password_file() const { return etcd_.password_file(); }
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
  bool tls_ = false;
  tools::LocalEtcd etcd_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_DAEMON_ETCD_PROCESS_H_
