#include "tools/metrics_text.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ckpt::tools {

std::vector<Sample> ParseMetricsText(absl::string_view text) {
  std::vector<Sample> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    size_t end_of_name = line.find_first_of("{ ");
    if (end_of_name == absl::string_view::npos) continue;
    s.name = std::string(line.substr(0, end_of_name));
    absl::string_view rest = line.substr(end_of_name);
    if (absl::ConsumePrefix(&rest, "{")) {
      size_t close = rest.find('}');
      if (close == absl::string_view::npos) continue;
      for (absl::string_view pair :
           absl::StrSplit(rest.substr(0, close), ',', absl::SkipEmpty())) {
        std::pair<absl::string_view, absl::string_view> kv =
            absl::StrSplit(pair, absl::MaxSplits('=', 1));
        absl::string_view value = kv.second;
        absl::ConsumePrefix(&value, "\"");
        absl::ConsumeSuffix(&value, "\"");
        s.labels[std::string(kv.first)] = std::string(value);
      }
      rest = rest.substr(close + 1);
    }
    rest = absl::StripAsciiWhitespace(rest);
    if (!absl::SimpleAtod(rest, &s.value)) continue;
    out.push_back(std::move(s));
  }
  return out;
}

std::optional<double> SumOf(const std::vector<Sample>& samples,
                            const std::string& name,
                            const std::map<std::string, std::string>& match) {
  std::optional<double> sum;
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool matches = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) matches = false;
    }
    if (matches) sum = sum.value_or(0) + s.value;
  }
  return sum;
}

}  // namespace ckpt::tools
