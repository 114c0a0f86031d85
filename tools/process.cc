#include "tools/process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace ckpt::tools {

pid_t Spawn(const std::vector<std::string>& args, const std::string& log,
            const std::string& env) {
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    // The child dies with the harness (a test runner's timeout SIGKILLs it):
    // an orphaned cluster would load the machine for every later test.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // it died before the prctl
    FILE* f = std::fopen(log.c_str(), "a");
    if (f != nullptr) {
      ::dup2(fileno(f), 1);
      ::dup2(fileno(f), 2);
    }
    if (!env.empty()) ::putenv(const_cast<char*>(env.c_str()));
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

std::string Sibling(const std::string& relative) {
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  return (self.parent_path() / relative).lexically_normal().string();
}

std::string Sibling(std::initializer_list<std::string> candidates) {
  for (const std::string& c : candidates) {
    std::error_code ec;
    if (std::filesystem::exists(Sibling(c), ec)) return Sibling(c);
  }
  return Sibling(*candidates.begin());
}

int FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool ListeningOnLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok =
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

namespace {

// A secret for a test cluster's etcd users: 16 random bytes in hex.
std::string RandomSecret() {
  unsigned char bytes[16] = {};
  if (::getrandom(bytes, sizeof(bytes), 0) != sizeof(bytes)) return "";
  std::string hex;
  for (unsigned char b : bytes) {
    hex += "0123456789abcdef"[b >> 4];
    hex += "0123456789abcdef"[b & 15];
  }
  return hex;
}

bool FileExists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

}  // namespace

LocalEtcd::LocalEtcd(std::string dir, Tls tls)
    : dir_(std::move(dir)),
      tls_(std::move(tls)),
      client_port_(FreeLoopbackPort()),
      peer_port_(FreeLoopbackPort()) {}

LocalEtcd::LocalEtcd(std::string dir, Secured secured)
    : dir_(std::move(dir)),
      secured_(std::move(secured)),
      tls_{.cert_file = dir_ + "/pki/etcd.pem",
           .key_file = dir_ + "/pki/etcd.key"},
      client_port_(FreeLoopbackPort()),
      peer_port_(FreeLoopbackPort()) {}

std::string LocalEtcd::ca_file() const {
  return secured() ? dir_ + "/pki/ca.pem" : "";
}

std::string LocalEtcd::password_file() const {
  return secured() ? dir_ + "/pki/etcd-password" : "";
}

std::vector<std::string> LocalEtcd::DaemonArgs() const {
  std::vector<std::string> args = {"--coordinator", "etcd://" + endpoint()};
  if (secured()) {
    args.insert(args.end(), {"--etcd-ca", ca_file(), "--etcd-user", user(),
                             "--etcd-password-file", password_file()});
  }
  return args;
}

bool LocalEtcd::MakeCredentials() {
  if (FileExists(password_file())) return true;
  const std::string pki = dir_ + "/pki";
  const std::string cmd = secured_.certs_tool + " ca " + pki + " >>" +
                          log_path() + " 2>&1 && " + secured_.certs_tool +
                          " node " + pki + " etcd 127.0.0.1 >>" + log_path() +
                          " 2>&1";
  if (std::system(cmd.c_str()) != 0) return false;
  for (const std::string& file :
       {pki + "/root-password", password_file() + ".tmp"}) {
    // Made 0600 before the secret is in it: never readable by others.
    const int fd =
        ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    const std::string secret = RandomSecret() + "\n";
    const bool written =
        ::fchmod(fd, 0600) == 0 && ::write(fd, secret.data(), secret.size()) ==
                                       static_cast<ssize_t>(secret.size());
    ::close(fd);
    if (!written) return false;
  }
  // Last: its presence says the credentials are whole.
  std::error_code ec;
  std::filesystem::rename(password_file() + ".tmp", password_file(), ec);
  return !ec;
}

bool LocalEtcd::Etcdctl(const std::string& command) const {
  const std::string cmd =
      "ETCDCTL_API=3 timeout 20 /usr/bin/etcdctl "
      "--endpoints https://" +
      endpoint() + " --cacert " + ca_file() + " " + command + " >>" +
      log_path() + " 2>&1";
  return std::system(cmd.c_str()) == 0;
}

bool LocalEtcd::EnableAuth() {
  const std::string done = dir_ + "/pki/auth-enabled";
  if (FileExists(done)) return true;
  auto first_line = [](const std::string& file) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);
    return line;
  };
  const std::string root = first_line(dir_ + "/pki/root-password");
  const std::string password = first_line(password_file());
  if (root.empty() || password.empty()) return false;
  for (const std::string& step :
       {"user add root:" + root, std::string("user grant-role root root"),
        "user add " + user() + ":" + password, std::string("role add ckptd"),
        std::string("role grant-permission ckptd --prefix=true readwrite "
                    "/ckpt/"),
        "user grant-role " + user() + " ckptd", std::string("auth enable")}) {
    if (!Etcdctl(step)) return false;
  }
  std::ofstream(done) << "yes\n";
  return true;
}

LocalEtcd::~LocalEtcd() { Kill(); }

std::string LocalEtcd::endpoint() const {
  return "127.0.0.1:" + std::to_string(client_port_);
}

bool LocalEtcd::Start() {
  if (pid_ > 0) return true;
  if (::access(kBinary, X_OK) != 0) return false;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (secured() && !MakeCredentials()) return false;
  const bool tls = !tls_.cert_file.empty();
  const std::string client = (tls ? "https://" : "http://") + endpoint();
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  std::vector<std::string> args = {kBinary, "--name", "ckpt-local",
                                   "--data-dir", dir_ + "/data"};
  for (const char* flag : {"--listen-client-urls", "--advertise-client-urls"}) {
    args.insert(args.end(), {flag, client});
  }
  for (const char* flag :
       {"--listen-peer-urls", "--initial-advertise-peer-urls"}) {
    args.insert(args.end(), {flag, peer});
  }
  args.insert(args.end(), {"--initial-cluster", "ckpt-local=" + peer});
  if (tls) {
    args.insert(args.end(),
                {"--cert-file", tls_.cert_file, "--key-file", tls_.key_file});
  }
  if (!tls_.client_ca_file.empty()) {
    args.insert(args.end(), {"--trusted-ca-file", tls_.client_ca_file,
                             "--client-cert-auth"});
  }
  pid_ = Spawn(args, log_path());
  if (pid_ <= 0) return false;
  if (AwaitChild(
          &pid_, [this] { return ListeningOnLoopback(client_port_); }, 800) &&
      (!secured() || EnableAuth())) {
    return true;
  }
  Kill();
  return false;
}

void LocalEtcd::Kill() { KillChild(&pid_); }

bool AwaitChild(pid_t* pid, const std::function<bool()>& ready, int polls) {
  for (int i = 0; i < polls; ++i) {
    int status;
    if (::waitpid(*pid, &status, WNOHANG) == *pid) {
      *pid = -1;
      return false;
    }
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

void KillChild(pid_t* pid) {
  if (*pid <= 0) return;
  ::kill(*pid, SIGCONT);
  ::kill(*pid, SIGKILL);
  ::waitpid(*pid, nullptr, 0);
  *pid = -1;
}

}  // namespace ckpt::tools
