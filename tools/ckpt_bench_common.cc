// ckpt-bench: helpers the benchmarks share (see tools/ckpt_bench.h).

#include <filesystem>
#include <iostream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "nlohmann/json.hpp"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"
#include "tools/process.h"

namespace ckpt::bench {

std::string RunCapture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  if (rc != 0) {
    std::cerr << "ckpt-bench: command failed (" << rc << "): " << cmd << "\n"
              << out << "\n";
    std::exit(1);
  }
  return out;
}

double Fio(const std::string& file, bool write, uint64_t size_mib,
           unsigned iodepth) {
  std::string cmd = absl::StrCat(
      "fio --name=ref --filename=", file,
      " --ioengine=io_uring --direct=1 --bs=1M --size=", size_mib,
      "M --rw=", write ? "write" : "read", " --iodepth=", iodepth,
      write ? " --end_fsync=1" : "", " --output-format=json 2>/dev/null");
  nlohmann::json j = nlohmann::json::parse(RunCapture(cmd));
  const auto& job = j["jobs"][0][write ? "write" : "read"];
  return job["bw_bytes"].get<double>() / (1 << 20);
}

pid_t StartDaemon(const std::string& dir, const std::string& staging,
                  uint64_t budget_mib, const std::vector<std::string>& flags) {
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  // In the build tree, or beside ckpt-bench (tools/gpu-check.sh's pack).
  std::string ckptd =
      (self.parent_path() / "../daemon/ckptd").lexically_normal().string();
  if (!std::filesystem::exists(ckptd)) {
    ckptd = (self.parent_path() / "ckptd").string();
  }
  std::string socket = dir + "/run/ckptd.sock";
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::fopen((dir + "/ckptd.log").c_str(), "a");
    if (f != nullptr) {
      ::dup2(fileno(f), 1);
      ::dup2(fileno(f), 2);
    }
    const std::string budget = std::to_string(budget_mib) + "M";
    const std::string data = dir + "/data";
    std::vector<const char*> argv = {ckptd.c_str(),
                                     "--socket",
                                     socket.c_str(),
                                     "--data-dir",
                                     data.c_str(),
                                     "--staging-dir",
                                     staging.c_str(),
                                     "--memory-budget",
                                     budget.c_str(),
                                     "--keep-memory",
                                     "1",
                                     "--keep-disk",
                                     "1"};
    for (const std::string& f : flags) argv.push_back(f.c_str());
    argv.push_back(nullptr);
    ::execv(ckptd.c_str(), const_cast<char* const*>(argv.data()));
    ::_exit(127);
  }
  for (int i = 0; i < 200; ++i) {
    if (ckpt::client::Checkpointer::Connect({"bench", 0, 1, socket}).ok())
      return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::cerr << "ckpt-bench: ckptd did not start; see " << dir << "/ckptd.log\n";
  ::kill(pid, SIGKILL);
  std::exit(1);
}

}  // namespace ckpt::bench
