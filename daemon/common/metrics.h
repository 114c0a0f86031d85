// Metrics is ckptd's registry of counters, gauges and histograms, rendered in
// the Prometheus text exposition format (version 0.0.4) for the /metrics
// endpoint. Series are identified by a metric name and label pairs; a metric's
// type and help are declared once. Units are in the names (_seconds, _bytes).
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_COMMON_METRICS_H_
#define CKPT_DAEMON_COMMON_METRICS_H_

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::daemon {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Metrics {
 public:
  enum class Type { kCounter, kGauge, kHistogram };

  // Declares a metric; `buckets` (upper bounds, ascending) for histograms.
  void Declare(const std::string& name, Type type, const std::string& help,
               std::vector<double> buckets = {});
  void Add(const std::string& name, const Labels& labels, double delta = 1);
  void Set(const std::string& name, const Labels& labels, double value);
  void Observe(const std::string& name, const Labels& labels, double value);
  // Called at every scrape, before rendering: for gauges read from elsewhere
  // (memory in use, ages).
  void OnScrape(std::function<void(Metrics&)> refresh);

  std::string Render();

  // Seconds buckets from 1 ms to ~17 min, doubling.
  static std::vector<double> SecondsBuckets();

 private:
  struct Series {
    double value = 0;              // counter, gauge
    std::vector<uint64_t> counts;  // histogram, per bucket (not cumulative)
    uint64_t count = 0;
    double sum = 0;
  };
  struct Metric {
    Type type;
    std::string help;
    std::vector<double> buckets;
    std::map<Labels, Series> series;
  };
  Series& SeriesOf(const std::string& name, const Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<std::string, Metric> metrics_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(Metrics&)>> refresh_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_COMMON_METRICS_H_
