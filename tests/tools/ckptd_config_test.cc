// ckptd's configuration file: settings from the file, options over them,
// unknown keys and bad values refused with their names, --print-config a
// config file that reads back the same; the packaged config, the systemd
// unit's command line and the Kubernetes ConfigMap are accepted as shipped;
// and a daemon started with nothing but --config serves where it says.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "tests/tools/run_cli.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

Result Ckptd(const std::string& args) { return RunProgram(CKPTD, args); }

std::string Source(const std::string& path) {
  return std::string(CKPT_SOURCE_DIR) + "/" + path;
}

// key -> value of a printed config (comments and blank lines skipped).
std::map<std::string, std::string> Settings(const std::string& text) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    std::pair<std::string, std::string> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    out[std::string(absl::StripAsciiWhitespace(kv.first))] =
        std::string(absl::StripAsciiWhitespace(kv.second));
  }
  return out;
}

TEST(CkptdConfigTest, TheFileSetsAndOptionsWin) {
  testing::TempDir dir;
  testing::WriteAll(dir.File("c.toml"),
                    "memory-budget = \"8G\"\nkeep-disk = 3\ncodec = \"zstd\"\n"
                    "# a comment\nfull-every = 4\n");
  Result r =
      Ckptd("--config " + dir.File("c.toml") + " --keep-disk 5 --print-config");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::map<std::string, std::string> s = Settings(r.out);
  EXPECT_EQ(s["memory-budget"], "\"8G\"");
  EXPECT_EQ(s["keep-disk"], "5");
  EXPECT_EQ(s["codec"], "\"zstd\"");
  EXPECT_EQ(s["full-every"], "4");
  EXPECT_EQ(s["keep-memory"], "1");  // a default
}

TEST(CkptdConfigTest, UnknownKeysAndBadValuesAreRefusedByName) {
  testing::TempDir dir;
  testing::WriteAll(dir.File("unknown.toml"), "keep-disks = 3\n");
  Result r = Ckptd("--config " + dir.File("unknown.toml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("unknown key \"keep-disks\""));
  EXPECT_THAT(r.out, HasSubstr(dir.File("unknown.toml")));

  testing::WriteAll(dir.File("range.toml"), "keep-disk = 0\n");
  r = Ckptd("--config " + dir.File("range.toml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("keep-disk"));

  testing::WriteAll(dir.File("codec.toml"), "codec = \"lz4\"\n");
  r = Ckptd("--config " + dir.File("codec.toml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("codec"));

  testing::WriteAll(dir.File("format.toml"), "shard-format = 2\n");
  r = Ckptd("--config " + dir.File("format.toml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("shard-format"));

  r = Ckptd("--config " + dir.File("missing.toml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("missing.toml"));
}

TEST(CkptdConfigTest, ThePrintedConfigReadsBackTheSame) {
  testing::TempDir dir;
  Result first = Ckptd("--memory-budget 2G --peer-replicas 2 --print-config");
  ASSERT_EQ(first.exit_code, 0) << first.out;
  testing::WriteAll(dir.File("printed.toml"), first.out);
  Result again =
      Ckptd("--config " + dir.File("printed.toml") + " --print-config");
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_EQ(again.out, first.out);
  EXPECT_EQ(Settings(again.out)["peer-replicas"], "2");
}

TEST(CkptdConfigTest, ThePackagedConfigIsAccepted) {
  Result r =
      Ckptd("--config " + Source("packaging/ckptd.toml") + " --print-config");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(Settings(r.out)["memory-budget"], "\"8G\"");
}

TEST(CkptdConfigTest, TheObjectStoreSettingsAreAcceptedAndChecked) {
  testing::TempDir dir;
  testing::WriteAll(dir.File("s3.toml"),
                    "shared-uri = \"s3://ckpt-bucket/jobs\"\n"
                    "s3-endpoint = \"http://127.0.0.1:8333\"\n"
                    "s3-region = \"eu-west-1\"\ns3-path-style = false\n"
                    "s3-part-mib = 32\ns3-concurrency = 4\n");
  Result r = Ckptd("--config " + dir.File("s3.toml") + " --print-config");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::map<std::string, std::string> s = Settings(r.out);
  EXPECT_EQ(s["shared-uri"], "\"s3://ckpt-bucket/jobs\"");
  EXPECT_EQ(s["s3-region"], "\"eu-west-1\"");
  EXPECT_EQ(s["s3-part-mib"], "32");
  Result small = Ckptd("--s3-part-mib 4 --print-config");
  EXPECT_NE(small.exit_code, 0);
  EXPECT_THAT(small.out, HasSubstr("s3-part-mib"));
}

// The unit's ExecStart, continuation lines joined, for instance `user`.
std::string ExecStart(const std::string& unit, const std::string& user) {
  std::string text = testing::ReadAll(unit);
  text = absl::StrReplaceAll(text, {{"\\\n", " "}});
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "ExecStart=")) {
      return absl::StrReplaceAll(line, {{"%i", user}});
    }
  }
  return "";
}

TEST(CkptdConfigTest, TheSystemdUnitsCommandLineIsAccepted) {
  std::string exec = ExecStart(Source("packaging/ckptd@.service"), "alice");
  ASSERT_THAT(exec, HasSubstr("/usr/bin/ckptd "));
  exec = absl::StrReplaceAll(
      exec, {{"/usr/bin/ckptd ", ""},
             {"/etc/ckpt/ckptd.toml", Source("packaging/ckptd.toml")},
             {"$CKPTD_EXTRA", ""}});
  Result r = Ckptd(exec + " --print-config");
  ASSERT_EQ(r.exit_code, 0) << exec << "\n" << r.out;
  std::map<std::string, std::string> s = Settings(r.out);
  EXPECT_EQ(s["socket"], "\"/run/ckpt-alice/ckptd.sock\"");
  EXPECT_EQ(s["data-dir"], "\"/var/lib/ckpt/alice\"");
  EXPECT_EQ(s["stop-timeout"], "100");
  const std::string unit = testing::ReadAll(Source("packaging/ckptd@.service"));
  EXPECT_THAT(unit, HasSubstr("Type=notify"));
  EXPECT_THAT(unit, HasSubstr("WatchdogSec="));
  EXPECT_THAT(unit, HasSubstr("RuntimeDirectory=ckpt-%i"));
}

TEST(CkptdConfigTest, TheKubernetesConfigMapsConfigIsAccepted) {
  // The block scalar under `ckptd.toml: |`, four spaces in.
  std::istringstream yaml(
      testing::ReadAll(Source("packaging/kubernetes/ckptd-daemonset.yaml")));
  std::string line, toml;
  bool in_block = false;
  while (std::getline(yaml, line)) {
    if (in_block) {
      if (!line.empty() && line.rfind("    ", 0) != 0) break;
      toml += (line.size() >= 4 ? line.substr(4) : "") + "\n";
    } else if (line == "  ckptd.toml: |") {
      in_block = true;
    }
  }
  ASSERT_FALSE(toml.empty());
  testing::TempDir dir;
  testing::WriteAll(dir.File("k8s.toml"), toml);
  Result r = Ckptd("--config " + dir.File("k8s.toml") + " --print-config");
  ASSERT_EQ(r.exit_code, 0) << toml << "\n" << r.out;
  EXPECT_EQ(Settings(r.out)["memory-budget"], "\"32G\"");
}

TEST(CkptdConfigTest, ADaemonStartedWithOnlyAConfigServesWhereItSays) {
  testing::TempDir dir;
  const std::string staging =
      "/dev/shm/ckpt-config-test-" + std::to_string(::getpid());
  testing::WriteAll(dir.File("c.toml"),
                    "socket = \"" + dir.File("run/ckptd.sock") +
                        "\"\ndata-dir = \"" + dir.File("data") +
                        "\"\nstaging-dir = \"" + staging +
                        "\"\nmemory-budget = \"64M\"\n");
  pid_t pid = ::fork();
  if (pid == 0) {
    const std::string config = dir.File("c.toml");
    ::execl(CKPTD, CKPTD, "--config", config.c_str(), nullptr);
    ::_exit(127);
  }
  bool serving = false;
  for (int i = 0; i < 400 && !serving; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    serving = std::filesystem::exists(dir.File("data/ckptd.json"));
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::error_code ec;
  std::filesystem::remove_all(staging, ec);
  EXPECT_TRUE(serving);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_THAT(testing::ReadAll(dir.File("data/ckptd.json")),
              HasSubstr(dir.File("run/ckptd.sock")));
}

}  // namespace
}  // namespace ckpt
