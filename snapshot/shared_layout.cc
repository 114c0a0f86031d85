#include "snapshot/shared_layout.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace ckpt::snapshot {
namespace {

constexpr absl::string_view kPinInfix = ".ckpt.base-of-";

}  // namespace

bool ParseCopyName(absl::string_view name, uint64_t* step, uint32_t* rank) {
  return absl::ConsumeSuffix(&name, ".ckpt") && name.size() == 31 &&
         name[20] == '-' && absl::SimpleAtoi(name.substr(0, 20), step) &&
         absl::SimpleAtoi(name.substr(21), rank);
}

bool ParseMarkerName(absl::string_view name, uint64_t* step) {
  return absl::ConsumeSuffix(&name, ".commit") && name.size() == 20 &&
         absl::SimpleAtoi(name, step);
}

bool ParsePinName(absl::string_view name, uint64_t* base, uint32_t* rank,
                  uint64_t* step) {
  const size_t at = name.find(kPinInfix);
  if (at == absl::string_view::npos) return false;
  const absl::string_view of = name.substr(at + kPinInfix.size());
  return of.size() == 20 && absl::SimpleAtoi(of, step) &&
         ParseCopyName(name.substr(0, at + 5), base, rank);
}

std::string PinName(uint64_t base, uint32_t rank, uint64_t step) {
  return absl::StrFormat("%020d-%010d%s%020d", base, rank, kPinInfix, step);
}

SharedRetention PlanSharedRetention(const std::vector<std::string>& names,
                                    std::vector<uint64_t> committed,
                                    size_t keep) {
  SharedRetention plan;
  std::sort(committed.rbegin(), committed.rend());
  committed.erase(std::unique(committed.begin(), committed.end()),
                  committed.end());
  if (committed.empty() || keep == 0) return plan;
  plan.oldest_kept = committed[std::min(committed.size(), keep) - 1];
  using Copy = std::pair<uint64_t, uint32_t>;  // step, rank
  std::set<Copy> named, kept;
  std::map<Copy, std::vector<Copy>> pins;  // the pinning copy -> its bases
  for (const std::string& name : names) {
    uint64_t step = 0, base = 0;
    uint32_t rank = 0;
    if (ParseMarkerName(name, &step)) {
      if (step < plan.oldest_kept) plan.markers.push_back(name);
      continue;
    }
    const bool pin = ParsePinName(name, &base, &rank, &step);
    if (pin) pins[{step, rank}].push_back({base, rank});
    if (pin || ParseCopyName(name, &step, &rank)) {
      named.insert({step, rank});
      if (step >= plan.oldest_kept) kept.insert({step, rank});
    }
  }
  // Newest first: bases are older than the copies built on them.
  for (auto it = named.rbegin(); it != named.rend(); ++it) {
    if (kept.count(*it) == 0) continue;
    for (const Copy& base : pins[*it]) kept.insert(base);
  }
  for (const std::string& name : names) {
    uint64_t step = 0, base = 0;
    uint32_t rank = 0;
    const bool pin = ParsePinName(name, &base, &rank, &step);
    if (!pin && !ParseCopyName(name, &step, &rank)) continue;
    if (step >= plan.oldest_kept) continue;
    if (kept.count({step, rank}) > 0) {
      if (!pin) plan.pinned_steps.insert(step);
      continue;
    }
    plan.copies.push_back(name);
    if (!pin) plan.dropped_steps.insert(step);
  }
  return plan;
}

}  // namespace ckpt::snapshot
