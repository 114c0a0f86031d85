// The Grafana dashboard shipped in packaging/grafana only asks for what
// ckptd exports: every metric an expression names is declared by a running
// ckptd with every tier on (histograms through their _bucket/_sum/_count series
// only), and every panel is a valid query panel with a data source.
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "absl/strings/str_split.h"
#include "client/daemon_admin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/daemon_process.h"

namespace ckpt {
namespace {

// name -> type ("counter", "gauge", "histogram") from the exposition text.
std::map<std::string, std::string> Exported(const std::string& text) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() == 4 && f[0] == "#" && f[1] == "TYPE") out[f[2]] = f[3];
  }
  return out;
}

TEST(DashboardTest, EveryExpressionNamesAMetricCkptdExports) {
  // Every tier on, so the peer and shared tiers' metrics are declared too.
  testing::TempDir shared;
  testing::DaemonProcess daemon(
      {"--peer-address", "127.0.0.1:0", "--shared-dir", shared.path()});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  absl::StatusOr<std::string> text = client::GetMetricsText(daemon.socket());
  ASSERT_TRUE(text.ok()) << text.status();
  const std::map<std::string, std::string> exported = Exported(*text);
  ASSERT_GT(exported.size(), 20u) << *text;

  std::ifstream in(std::string(CKPT_SOURCE_DIR) +
                   "/packaging/grafana/ckpt-dashboard.json");
  ASSERT_TRUE(in);
  const nlohmann::json dashboard = nlohmann::json::parse(in);
  ASSERT_TRUE(dashboard.contains("panels"));
  const std::regex metric("ckpt_[a-z0-9_]+");
  std::set<std::string> used;
  int expressions = 0;
  for (const nlohmann::json& panel : dashboard["panels"]) {
    const std::string title = panel.value("title", "");
    ASSERT_TRUE(panel.contains("targets")) << title;
    ASSERT_TRUE(panel.contains("datasource")) << title;
    for (const nlohmann::json& target : panel["targets"]) {
      const std::string expr = target.at("expr").get<std::string>();
      ++expressions;
      for (std::sregex_iterator m(expr.begin(), expr.end(), metric), end;
           m != end; ++m) {
        std::string name = m->str();
        std::string base = name;
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
          const std::string s = suffix;
          if (base.size() > s.size() &&
              base.compare(base.size() - s.size(), s.size(), s) == 0 &&
              exported.count(base.substr(0, base.size() - s.size())) > 0) {
            base = base.substr(0, base.size() - s.size());
          }
        }
        auto it = exported.find(base);
        ASSERT_NE(it, exported.end()) << "panel \"" << title << "\": " << name
                                      << " is not a metric ckptd exports";
        if (it->second == "histogram") {
          EXPECT_NE(name, base) << "panel \"" << title << "\": histogram "
                                << name << " needs _bucket, _sum or _count";
        } else {
          EXPECT_EQ(name, base) << "panel \"" << title << "\": " << name;
        }
        used.insert(base);
      }
    }
  }
  EXPECT_GE(expressions, 20);
  // What the issue asks the dashboard to show.
  for (const char* must :
       {"ckpt_staging_seconds", "ckpt_persisted_bytes_total",
        "ckpt_replicated_bytes_total", "ckpt_commit_latency_seconds",
        "ckpt_last_commit_age_seconds", "ckpt_failures_detected_total",
        "ckpt_recoveries_total", "ckpt_young_daly_interval_seconds"}) {
    EXPECT_EQ(used.count(must), 1u) << must << " is on no panel";
  }
}

}  // namespace
}  // namespace ckpt
