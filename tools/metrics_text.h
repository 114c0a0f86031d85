// Reads the Prometheus text format that ckptd's metrics render (for `ckpt
// status`): every sample as name, labels and value.
//
// Thread-safety: pure functions, callable from any thread.
#ifndef CKPT_TOOLS_METRICS_TEXT_H_
#define CKPT_TOOLS_METRICS_TEXT_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ckpt::tools {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// The samples of `text`; comment lines and lines that do not parse are
// skipped.
std::vector<Sample> ParseMetricsText(absl::string_view text);

// The sum of the samples named `name` whose labels include `match`; nullopt
// when there is none.
std::optional<double> SumOf(const std::vector<Sample>& samples,
                            const std::string& name,
                            const std::map<std::string, std::string>& match);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_METRICS_TEXT_H_
