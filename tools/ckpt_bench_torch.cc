// ckpt-bench torch: ckpt.torch against PyTorch DCP (tools/bench_torch.py).
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"
#include "tools/process.h"

namespace ckpt::bench {

int RunTorch(const std::string& dir, uint64_t state_mib, int runs, bool json,
             const std::string& host_snapshot, bool huge_pages,
             std::string python) {
  std::error_code ec;
  std::filesystem::remove_all(dir + "/data", ec);
  std::filesystem::create_directories(dir + "/run");
  BenchDaemon guard;
  guard.staging = "/dev/shm/ckpt-bench-staging-" + std::to_string(::getpid());
  std::filesystem::create_directories(guard.staging);
  guard.pid = StartDaemon(dir, guard.staging, 3 * state_mib + 256);
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  const std::string python_dir =
      (self.parent_path() / "../python").lexically_normal().string();
  const std::string script = python_dir + "/bench_torch.py";
  // PyPI's PyTorch (tools/torch-venv.sh) when the build has it: DCP's
  // async_save is the reference there. Else Debian's python3-torch.
  if (python.empty()) {
    const std::string venv =
        (self.parent_path() / "../torch-venv/bin/python").lexically_normal();
    python = ::access(venv.c_str(), X_OK) == 0 ? venv : CKPT_PYTHON;
  }
  const std::string socket = dir + "/run/ckptd.sock";
  const std::string mib = std::to_string(state_mib);
  const std::string runs_arg = std::to_string(runs);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("PYTHONPATH", python_dir.c_str(), 1);
    // glibc's malloc then asks for transparent huge pages for its large
    // allocations (torch's tensors), what fork snapshots want.
    if (huge_pages) ::setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1", 1);
    std::vector<const char*> argv = {
        python.c_str(),   script.c_str(),    "--socket",
        socket.c_str(),   "--dir",           dir.c_str(),
        "--state-mib",    mib.c_str(),       "--runs",
        runs_arg.c_str(), "--host-snapshot", host_snapshot.c_str()};
    if (huge_pages) argv.push_back("--huge-pages");
    if (json) argv.push_back("--json");
    argv.push_back(nullptr);
    ::execv(python.c_str(), const_cast<char* const*>(argv.data()));
    std::cerr << "ckpt-bench: cannot run " << python << ": "
              << std::strerror(errno) << "\n";
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace ckpt::bench
