// ckptd's /metrics endpoint scraped with a real HTTP client while a job saves:
// every metric is present and well-formed, and the figures move as the run
// proceeds.
#include <httplib.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "tests/client/daemon_process.h"
#include "tests/tools/run_cli.h"

namespace ckpt {
namespace {

// Sample lines by series ("name{labels}"), after checking every line against
// the text format.
std::map<std::string, double> Scrape(int port, std::set<std::string>* typed) {
  httplib::Client http("127.0.0.1", port);
  auto res = http.Get("/metrics");
  EXPECT_TRUE(res) << "no answer on port " << port;
  std::map<std::string, double> samples;
  if (!res) return samples;
  EXPECT_EQ(res->status, 200);
  EXPECT_THAT(res->get_header_value("Content-Type"),
              ::testing::HasSubstr("text/plain"));
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})?) (\S+)$)");
  static const std::regex type(
      R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram)$)");
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, type)) {
      typed->insert(m[1]);
    } else if (line.rfind("# HELP ", 0) == 0) {
      continue;
    } else {
      EXPECT_TRUE(std::regex_match(line, m, sample)) << "bad line: " << line;
      if (!m.empty()) samples[m[1]] = std::stod(m[4]);
    }
  }
  return samples;
}

TEST(MetricsEndpointTest, MetricsArePresentWellFormedAndMoveWithTheRun) {
  testing::DaemonProcess daemon({"--metrics-address", "127.0.0.1:0"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  std::smatch m;
  std::string log = daemon.log();
  ASSERT_TRUE(std::regex_search(
      log, m, std::regex(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)")))
      << log;
  const int port = std::stoi(m[1]);

  std::set<std::string> typed;
  std::map<std::string, double> before = Scrape(port, &typed);
  for (const char* name :
       {"ckpt_staging_seconds",        "ckpt_staged_bytes_total",
        "ckpt_persisted_bytes_total",  "ckpt_persist_seconds",
        "ckpt_compression_ratio",      "ckpt_commit_latency_seconds",
        "ckpt_last_committed_step",    "ckpt_last_commit_age_seconds",
        "ckpt_steps_skipped_total",    "ckpt_persist_failures_total",
        "ckpt_memory_tier_bytes",      "ckpt_memory_budget_bytes",
        "ckpt_recovered_shards_total", "ckpt_failures_detected_total",
        "ckpt_save_interval_seconds",  "ckpt_young_daly_interval_seconds",
        "ckpt_recoveries_total",       "ckpt_recovery_seconds",
        "ckpt_disk_tier_bytes",        "ckpt_disk_budget_bytes"}) {
    EXPECT_EQ(typed.count(name), 1u) << name << " is not declared";
  }
  EXPECT_EQ(before["ckpt_memory_budget_bytes"], 256.0 * (1 << 20));

  auto c = client::Checkpointer::Connect({"m", 0, 1, daemon.socket()});
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> w(1 << 16, 1.5f);
  ASSERT_TRUE((*c)->RegisterTensor("w", proto::DTYPE_FLOAT32, w.data(),
                                   {static_cast<int64_t>(w.size())}, {0},
                                   {static_cast<int64_t>(w.size())})
                  .ok());
  for (uint64_t step = 1; step <= 3; ++step) {
    auto save = (*c)->SaveAsync(step);
    ASSERT_TRUE(save.ok());
    ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
    std::map<std::string, double> now = Scrape(port, &typed);
    const std::string job = "{job=\"m\"}";
    EXPECT_EQ(now["ckpt_staged_bytes_total" + job], step * w.size() * 4.0);
    EXPECT_EQ(now["ckpt_staging_seconds_count" + job], step)
        << "the histogram counts saves";
    EXPECT_EQ(now["ckpt_persisted_bytes_total" + job], step * w.size() * 4.0);
    EXPECT_EQ(now["ckpt_persist_seconds_count" + job], step);
    EXPECT_LT(now["ckpt_compression_ratio" + job], 0.5) << "constant floats";
    EXPECT_EQ(now["ckpt_last_committed_step{job=\"m\",tier=\"local_disk\"}"],
              step);
    EXPECT_EQ(now["ckpt_commit_latency_seconds_count{job=\"m\",tier="
                  "\"memory\"}"],
              step);
    EXPECT_GE(now["ckpt_last_commit_age_seconds{job=\"m\",tier=\"memory\"}"],
              0);
    EXPECT_GT(now["ckpt_memory_tier_bytes"], 0) << "the newest step's slot";
  }
  // Restores by source tier; a damaged memory-tier copy is a checksum
  // mismatch and a fallback to the file.
  ASSERT_TRUE((*c)->Restore(3).ok());
  auto shard = (*c)->DescribeShard(3);
  ASSERT_TRUE(shard.ok() && !shard->slot_path().empty());
  {
    auto slot = io::DefaultFileSystem()->MapFile(shard->slot_path(), {});
    ASSERT_TRUE(slot.ok()) << slot.status();
    (*slot)->data()[7] ^= 0x40;
  }
  ASSERT_TRUE((*c)->Restore(3).ok());
  EXPECT_EQ(w[1], 1.5f) << "the damaged element came from the file";
  std::map<std::string, double> restored = Scrape(port, &typed);
  const double bytes = w.size() * 4.0;
  EXPECT_EQ(restored["ckpt_restores_total{job=\"m\",source=\"memory\"}"], 1);
  EXPECT_EQ(restored["ckpt_restored_bytes_total{job=\"m\",source=\"memory\"}"],
            bytes);
  EXPECT_EQ(restored["ckpt_restores_total{job=\"m\",source=\"local_disk\"}"],
            1);
  EXPECT_EQ(restored["ckpt_checksum_mismatches_total{job=\"m\"}"], 1);
  EXPECT_EQ(restored["ckpt_restore_fallbacks_total{job=\"m\"}"], 1);

  // The job "restarts" from step 1: rank 0 saves step 2 again (refused, it is
  // committed), which ckptd counts as a failure; the Young/Daly interval then
  // appears next to the interval in use.
  EXPECT_FALSE((*c)->SaveAsync(2).ok());
  std::map<std::string, double> after = Scrape(port, &typed);
  EXPECT_EQ(
      after["ckpt_failures_detected_total{job=\"m\",kind=\"job_restart\"}"], 1);
  EXPECT_GT(after["ckpt_save_interval_seconds{job=\"m\"}"], 0);
  EXPECT_GT(after["ckpt_save_cost_seconds{job=\"m\"}"], 0);
  EXPECT_GT(after["ckpt_mtbf_seconds{job=\"m\"}"], 0);
  EXPECT_GT(after["ckpt_young_daly_interval_seconds{job=\"m\"}"], 0);
  // That re-save was the job's first save after its failure: a recovery, and
  // its time (since the last save before it) in the histogram.
  EXPECT_EQ(after["ckpt_recoveries_total{job=\"m\",kind=\"job_restart\"}"], 1);
  EXPECT_EQ(
      after["ckpt_recovery_seconds_count{job=\"m\",kind=\"job_restart\"}"], 1);
  EXPECT_GT(after["ckpt_disk_tier_bytes"], 0);
  EXPECT_GT(after["ckpt_disk_budget_bytes"], after["ckpt_disk_tier_bytes"]);
}

// A daemon restart under a job: detected at start, and the job's first save
// after it completes a recovery. `ckpt status` shows the same figures.
TEST(MetricsEndpointTest, DaemonRestartIsARecoveryAndStatusShowsTheFigures) {
  testing::DaemonProcess daemon({"--metrics-address", "127.0.0.1:0"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  std::vector<float> w(1 << 12, 2.5f);
  // The trainer lives on while ckptd restarts under it (a job that ended
  // cleanly before a restart had no failure).
  auto c = client::Checkpointer::Connect({"r", 0, 1, daemon.socket()});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->RegisterTensor("w", proto::DTYPE_FLOAT32, w.data(),
                                   {static_cast<int64_t>(w.size())}, {0},
                                   {static_cast<int64_t>(w.size())})
                  .ok());
  auto save = [&](uint64_t step) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (;;) {  // until the restarted daemon answers
      auto s = (*c)->SaveAsync(step);
      if (s.ok() && (*s)->WaitCommitted(proto::TIER_LOCAL_DISK).ok()) return;
      ASSERT_LT(absl::Now(), deadline) << daemon.log();
      absl::SleepFor(absl::Milliseconds(100));
    }
  };
  save(1);
  daemon.Kill();
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  save(2);
  std::smatch m;
  std::string log = daemon.log();
  std::string::const_iterator from = log.cbegin();
  int port = 0;
  const std::regex address(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  while (std::regex_search(from, log.cend(), m, address)) {
    port = std::stoi(m[1]);  // the restarted daemon's is the last one
    from = m.suffix().first;
  }
  std::set<std::string> typed;
  std::map<std::string, double> now = Scrape(port, &typed);
  EXPECT_EQ(
      now["ckpt_failures_detected_total{job=\"r\",kind=\"daemon_restart\"}"],
      1);
  EXPECT_EQ(now["ckpt_recoveries_total{job=\"r\",kind=\"daemon_restart\"}"], 1);
  EXPECT_EQ(
      now["ckpt_recovery_seconds_count{job=\"r\",kind=\"daemon_restart\"}"], 1);

  const std::string out =
      RunCli(absl::StrCat("--data-dir ", daemon.data_dir(), " status --socket ",
                          daemon.socket()))
          .out;
  EXPECT_THAT(out, ::testing::HasSubstr("saves      1 (stall mean"));
  EXPECT_THAT(out, ::testing::HasSubstr(
                       "0 job restart(s), 1 daemon restart(s); 1 recoveries"));
  EXPECT_THAT(out, ::testing::HasSubstr("of a 256.0 MiB budget"));
  const std::string json =
      RunCli(absl::StrCat("--data-dir ", daemon.data_dir(),
                          " status --json --socket ", daemon.socket()))
          .out;
  EXPECT_THAT(json, ::testing::HasSubstr("\"recoveries\": 1.0"));
  EXPECT_THAT(json, ::testing::HasSubstr("\"persist_bytes_per_s\""));
}

}  // namespace
}  // namespace ckpt
