// Runs the `ckpt` command (or another program) as operators do: a real process,
// its exit code and its output (stdout and stderr together).
#ifndef CKPT_TESTS_TOOLS_RUN_CLI_H_
#define CKPT_TESTS_TOOLS_RUN_CLI_H_

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace ckpt {

struct Result {
  int exit_code;
  std::string out;
};

// Runs `program args` through the shell, with `env` (VAR=value ...) before it.
inline Result RunProgram(const std::string& program, const std::string& args,
                         const std::string& env = "") {
  std::string cmd =
      env + (env.empty() ? "" : " ") + program + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  Result r{-1, ""};
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline Result RunCli(const std::string& args, const std::string& env = "") {
  return RunProgram(CKPT_CLI, args, env);
}

}  // namespace ckpt

#endif  // CKPT_TESTS_TOOLS_RUN_CLI_H_
