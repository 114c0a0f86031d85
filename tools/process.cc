#include "tools/process.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace ckpt::tools {

pid_t Spawn(const std::vector<std::string>& args, const std::string& log,
            const std::string& env) {
  pid_t pid = ::fork();
  if (pid == 0) {
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

}  // namespace ckpt::tools
