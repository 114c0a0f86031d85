#include "daemon/common/metrics.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {
namespace {

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string LabelText(const Labels& labels, const std::string& extra_key = "",
                      const std::string& extra_value = "") {
  std::string out;
  for (const auto& [k, v] : labels) {
    absl::StrAppend(&out, out.empty() ? "" : ",", k, "=\"", Escape(v), "\"");
  }
  if (!extra_key.empty()) {
    absl::StrAppend(&out, out.empty() ? "" : ",", extra_key, "=\"", extra_value,
                    "\"");
  }
  return out.empty() ? "" : absl::StrCat("{", out, "}");
}

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::vector<double> Metrics::SecondsBuckets() {
  std::vector<double> b;
  for (double v = 0.001; v < 1100; v *= 2) b.push_back(v);
  return b;
}

void Metrics::Declare(const std::string& name, Type type,
                      const std::string& help, std::vector<double> buckets) {
  absl::MutexLock lock(&mu_);
  Metric& m = metrics_[name];
  m.type = type;
  m.help = help;
  m.buckets = std::move(buckets);
}

Metrics::Series& Metrics::SeriesOf(const std::string& name,
                                   const Labels& labels) {
  Metric& m = metrics_[name];  // undeclared metrics render as untyped gauges
  Series& s = m.series[labels];
  if (m.type == Type::kHistogram && s.counts.size() != m.buckets.size())
    s.counts.resize(m.buckets.size());
  return s;
}

void Metrics::Add(const std::string& name, const Labels& labels, double delta) {
  absl::MutexLock lock(&mu_);
  SeriesOf(name, labels).value += delta;
}

void Metrics::Set(const std::string& name, const Labels& labels, double value) {
  absl::MutexLock lock(&mu_);
  SeriesOf(name, labels).value = value;
}

void Metrics::Observe(const std::string& name, const Labels& labels,
                      double value) {
  absl::MutexLock lock(&mu_);
  const std::vector<double>& buckets = metrics_[name].buckets;
  Series& s = SeriesOf(name, labels);
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (value <= buckets[i]) {
      ++s.counts[i];
      break;
    }
  }
  ++s.count;
  s.sum += value;
}

void Metrics::OnScrape(std::function<void(Metrics&)> refresh) {
  absl::MutexLock lock(&mu_);
  refresh_.push_back(std::move(refresh));
}

std::string Metrics::Render() {
  std::vector<std::function<void(Metrics&)>> refresh;
  {
    absl::MutexLock lock(&mu_);
    refresh = refresh_;
  }
  for (auto& f : refresh) f(*this);  // they take the lock themselves
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, m] : metrics_) {
    const char* type = m.type == Type::kCounter     ? "counter"
                       : m.type == Type::kHistogram ? "histogram"
                                                    : "gauge";
    absl::StrAppend(&out, "# HELP ", name, " ", m.help, "\n# TYPE ", name, " ",
                    type, "\n");
    for (const auto& [labels, s] : m.series) {
      if (m.type != Type::kHistogram) {
        absl::StrAppend(&out, name, LabelText(labels), " ", Number(s.value),
                        "\n");
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i < m.buckets.size(); ++i) {
        cumulative += s.counts[i];
        absl::StrAppend(&out, name, "_bucket",
                        LabelText(labels, "le", Number(m.buckets[i])), " ",
                        cumulative, "\n");
      }
      absl::StrAppend(&out, name, "_bucket", LabelText(labels, "le", "+Inf"),
                      " ", s.count, "\n", name, "_sum", LabelText(labels), " ",
                      Number(s.sum), "\n", name, "_count", LabelText(labels),
                      " ", s.count, "\n");
    }
  }
  return out;
}

}  // namespace ckpt::daemon
