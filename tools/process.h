// Child processes for the demo, the chaos harness, the benchmarks and the
// tests: start a binary with its output appended to a log, find a binary next
// to this one, pick a free loopback port, run a local etcd.
#ifndef CKPT_TOOLS_PROCESS_H_
#define CKPT_TOOLS_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

namespace ckpt::tools {

// Forks and execs args[0] with `args`, stdout and stderr appended to `log`;
// `env` ("NAME=value"), when given, is added to the child's environment. The
// child is SIGKILLed when the thread that spawned it exits (PR_SET_PDEATHSIG):
// call it from a thread that lives as long as the child should.
// Returns the child's pid (-1 if fork failed).
pid_t Spawn(const std::vector<std::string>& args, const std::string& log,
            const std::string& env = "");

// The path of `relative` taken from this executable's directory.
std::string Sibling(const std::string& relative);
// The first of `candidates` (relative as above) that exists, else the first:
// a tool finds its companions in the build tree and when installed.
std::string Sibling(std::initializer_list<std::string> candidates);

// A loopback TCP port nobody listens on now (for a local etcd).
int FreeLoopbackPort();

// Whether something accepts TCP connections on loopback `port`.
bool ListeningOnLoopback(int port);

// Polls every 25 ms, for up to `polls` times, until `ready` holds: true then;
// false if child `*pid` exited first (*pid becomes -1) or time ran out.
bool AwaitChild(pid_t* pid, const std::function<bool()>& ready, int polls);

// SIGKILLs child `*pid` (continued first, if stopped) and reaps it; *pid
// becomes -1. Nothing if it is not positive.
void KillChild(pid_t* pid);

// A one-member etcd (Debian's etcd-server) on loopback ports chosen once, with
// its data in `dir`: started, SIGKILLed and started again on the same data and
// ports (a crash and restart), stopped and continued.
class LocalEtcd {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";

  // TLS on its client URL (https): its certificate and key, and the CA that
  // must have signed every client's certificate (empty: none required).
  struct Tls {
    std::string cert_file, key_file, client_ca_file;
  };
  // As a deployment runs it: https with a certificate that `certs_tool`
  // (tools/ckpt-certs) makes, and etcd's auth on, with a user `user` allowed
  // to read and write /ckpt/ only, its password in a file only this uid may
  // read. Made at the first Start (etcdctl enables the auth); a restart on
  // the same data keeps them.
  struct Secured {
    std::string certs_tool;
    std::string user = "ckptd";
  };
  explicit LocalEtcd(std::string dir, Tls tls = {});
  LocalEtcd(std::string dir, Secured secured);
  ~LocalEtcd();  // kills it
  LocalEtcd(const LocalEtcd&) = delete;
  LocalEtcd& operator=(const LocalEtcd&) = delete;

  // Starts etcd (log: <dir>/etcd.log) and waits until it accepts connections;
  // false if the binary is missing, exits, or does not listen within 20 s.
  bool Start();
  // SIGKILL (a stopped etcd is continued first), reaped.
  void Kill();
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // host:port of its client URL.
  std::string endpoint() const;
  std::string log_path() const { return dir_ + "/etcd.log"; }
  // The ckptd flags that reach it: --coordinator, and when it is secured,
  // --etcd-ca, --etcd-user and --etcd-password-file.
  std::vector<std::string> DaemonArgs() const;
  // A secured etcd's CA, user and password file (empty strings otherwise).
  std::string ca_file() const;
  const std::string& user() const { return secured_.user; }
  std::string password_file() const;

 private:
  bool secured() const { return !secured_.certs_tool.empty(); }
  // The CA, etcd's certificate and the password, made once.
  bool MakeCredentials();
  // Runs etcdctl against this etcd (output to the log); false if it failed.
  bool Etcdctl(const std::string& command) const;
  // Adds the root and ckptd users and turns auth on, once.
  bool EnableAuth();

  const std::string dir_;
  const Secured secured_;
  const Tls tls_;
  const int client_port_, peer_port_;
  pid_t pid_ = -1;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_PROCESS_H_
