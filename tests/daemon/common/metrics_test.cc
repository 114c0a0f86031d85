#include "daemon/common/metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, RendersThePrometheusTextFormat) {
  Metrics m;
  m.Declare("c_total", Metrics::Type::kCounter, "a counter");
  m.Declare("g_bytes", Metrics::Type::kGauge, "a gauge");
  m.Declare("h_seconds", Metrics::Type::kHistogram, "a histogram", {0.1, 1});
  m.Add("c_total", {{"job", "a\"b"}}, 2);
  m.Add("c_total", {{"job", "a\"b"}});
  m.Set("g_bytes", {}, 42);
  m.Observe("h_seconds", {{"job", "j"}}, 0.05);
  m.Observe("h_seconds", {{"job", "j"}}, 0.5);
  m.Observe("h_seconds", {{"job", "j"}}, 5);
  int scrapes = 0;
  m.OnScrape([&](Metrics& self) { self.Set("g_bytes", {}, ++scrapes); });
  const std::string text = m.Render();
  EXPECT_THAT(text, HasSubstr("# HELP c_total a counter\n# TYPE c_total "
                              "counter\nc_total{job=\"a\\\"b\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("g_bytes 1\n")) << "refreshed at the scrape";
  EXPECT_THAT(
      text,
      HasSubstr("h_seconds_bucket{job=\"j\",le=\"0.10000000000000001\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("h_seconds_bucket{job=\"j\",le=\"1\"} 2\n"))
      << "buckets are cumulative";
  EXPECT_THAT(text, HasSubstr("h_seconds_bucket{job=\"j\",le=\"+Inf\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("h_seconds_sum{job=\"j\"} 5.5"));
  EXPECT_THAT(text, HasSubstr("h_seconds_count{job=\"j\"} 3\n"));
}

}  // namespace
}  // namespace ckpt::daemon
