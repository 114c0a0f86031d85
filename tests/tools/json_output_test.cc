// Every --json output is one JSON document on stdout and nothing else (logs go
// to stderr): each command's stdout, alone, goes through a strict parser.
// ckpt's subcommands against a real ckptd (publish and topics too),
// ckpt-chaos, ckpt-bench control-plane.
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "client/checkpointer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/daemon_process.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

struct Output {
  int exit_code = -1;
  std::string out;  // stdout only
};

// Runs `command` with its stderr discarded; returns its stdout.
Output RunStdout(const std::string& command) {
  Output r;
  FILE* p = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The stdout of `command`, parsed strictly: one document, nothing around it
// but whitespace.
nlohmann::json ParseStdout(const std::string& command, int expected_exit = 0) {
  const Output r = RunStdout(command);
  EXPECT_EQ(r.exit_code, expected_exit) << command << "\n" << r.out;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << command << ": stdout is not one JSON document ("
                  << e.what() << "):\n"
                  << r.out.substr(0, 2000);
    return nullptr;
  }
}

TEST(JsonOutputTest, CkptSubcommands) {
  testing::DaemonProcess daemon({"--keep-disk", "5"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  {
    std::vector<float> w(4096, 1.5f);
    auto c = client::Checkpointer::Connect({"job", 0, 1, daemon.socket()});
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->RegisterTensor("w", proto::DTYPE_FLOAT32, w.data(),
                                     {4096}, {0}, {4096})
                    .ok());
    for (uint64_t step = 1; step <= 2; ++step) {
      auto save = (*c)->SaveAsync(step);
      ASSERT_TRUE(save.ok()) << save.status();
      ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
    }
  }
  testing::TempDir out;
  const std::string ckpt =
      std::string(CKPT_CLI) + " --data-dir " + daemon.data_dir() + " ";
  const std::string socket = " --socket " + daemon.socket();
  const std::vector<std::string> commands = {
      "ls --json",
      "ls job --json",
      "inspect job 2 --json",
      "verify job --json",
      "status --json" + socket,
      "gc job --keep 1 --dry-run --json" + socket,
      "restore-plan job 2 --world 2 --json" + socket,
      "export job 2 " + out.File("w.safetensors") + " --json"};
  for (const std::string& args : commands) {
    nlohmann::json j = ParseStdout(ckpt + args);
    EXPECT_FALSE(j.is_null()) << args;
  }
  // Publication: the version made, then the topic listed with it held here.
  nlohmann::json published = ParseStdout(
      ckpt + "publish job 2 --topic policy --cast bf16 --json" + socket);
  EXPECT_EQ(published["version"], 1);
  EXPECT_EQ(published["cast"], "bf16");
  nlohmann::json topics = ParseStdout(ckpt + "topics --json" + socket);
  ASSERT_TRUE(topics.is_array() && topics.size() == 1) << topics;
  EXPECT_EQ(topics[0]["topic"], "policy");
  EXPECT_EQ(topics[0]["held"], nlohmann::json::array({1}));
  // A step that is not committed: exit 1, nothing on stdout.
  const Output refused =
      RunStdout(ckpt + "publish job 9 --topic policy --json" + socket);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_EQ(refused.out, "");
}

TEST(JsonOutputTest, ChaosReport) {
  testing::TempDir dir;
  nlohmann::json j = ParseStdout(
      std::string(CKPT_CHAOS) +
      " --faults 2 --kinds kill_trainer,kill_daemon --elements 4096 --json "
      "--dir " +
      dir.path());
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["faults_injected"], 2);
  EXPECT_EQ(j["violations"], 0) << j.dump();
}

TEST(JsonOutputTest, BenchControlPlane) {
  testing::TempDir dir;
  nlohmann::json j = ParseStdout(
      std::string(CKPT_BENCH) +
      " control-plane --ranks 8 --nodes 2 --runs 2 --json --dir " + dir.path());
  ASSERT_TRUE(j.is_object());
  EXPECT_TRUE(j.contains("benchmark")) << j.dump();
}

}  // namespace
}  // namespace ckpt
