// Child processes for the demo, the chaos harness, the benchmarks and the
// tests: start a binary with its output appended to a log, find a binary next
// to this one, pick a free loopback port.
#ifndef CKPT_TOOLS_PROCESS_H_
#define CKPT_TOOLS_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace ckpt::tools {

// Forks and execs args[0] with `args`, stdout and stderr appended to `log`;
// `env` ("NAME=value"), when given, is added to the child's environment.
// Returns the child's pid (-1 if fork failed).
pid_t Spawn(const std::vector<std::string>& args, const std::string& log,
            const std::string& env = "");

// The path of `relative` taken from this executable's directory.
std::string Sibling(const std::string& relative);

// A loopback TCP port nobody listens on now (for a local etcd).
int FreeLoopbackPort();

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_PROCESS_H_
