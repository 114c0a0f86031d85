#include "daemon/health/stragglers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

Stragglers::Stragglers(Metrics* metrics) : metrics_(metrics) {
  using T = Metrics::Type;
  metrics_->Declare("ckpt_save_lag_seconds", T::kHistogram,
                    "how far each rank's shard of a committed step arrived "
                    "behind the step's first",
                    {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30});
  metrics_->Declare("ckpt_stragglers", T::kGauge,
                    "ranks whose saves keep arriving in the tail of their "
                    "steps (flagged)");
  metrics_->Declare("ckpt_straggler_lag_seconds", T::kGauge,
                    "a flagged rank's mean lag over the last steps, by rank "
                    "and node (0 once no longer flagged)");
}

void Stragglers::Saw(const proto::ReplicaCheck& check) {
  if (check.arrivals().empty()) return;
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[check.job()];
  if (job.steps.count(check.step()) != 0) return;  // seen
  if (job.steps.size() >= kWindow && check.step() < job.steps.begin()->first)
    return;  // older than the window
  job.steps[check.step()] = {check.arrivals().begin(), check.arrivals().end()};
  while (job.steps.size() > kWindow) job.steps.erase(job.steps.begin());
  for (const proto::RankArrival& a : check.arrivals()) {
    metrics_->Observe("ckpt_save_lag_seconds", {{"job", check.job()}},
                      static_cast<double>(a.lag_micros()) / 1e6);
  }
  std::vector<Flag> flagged = Judge(job);
  Export(check.job(), job.flagged, flagged);
  job.flagged = std::move(flagged);
}

std::set<uint32_t> Stragglers::Tail(const Arrivals& step) {
  std::vector<int64_t> lags;
  for (const proto::RankArrival& a : step) lags.push_back(a.lag_micros());
  std::sort(lags.begin(), lags.end());
  const int64_t median = lags[lags.size() / 2];
  // The slowest tenth, at least the slowest rank.
  const size_t tenth = std::max<size_t>(1, lags.size() / 10);
  const int64_t threshold = std::max({lags[lags.size() - tenth], 2 * median + 1,
                                      absl::ToInt64Microseconds(kLagFloor)});
  std::set<uint32_t> tail;
  for (const proto::RankArrival& a : step) {
    if (a.lag_micros() >= threshold) tail.insert(a.rank());
  }
  return tail;
}

std::vector<Stragglers::Flag> Stragglers::Judge(const Job& job) {
  if (job.steps.size() < kWindow) return {};
  std::map<uint32_t, Flag> ranks;
  for (const auto& [step, arrivals] : job.steps) {
    std::set<uint32_t> tail = Tail(arrivals);
    for (const proto::RankArrival& a : arrivals) {
      Flag& f = ranks[a.rank()];
      f.rank = a.rank();
      f.node = a.node();
      f.tail_steps += tail.count(a.rank());
      f.mean_lag_s += static_cast<double>(a.lag_micros()) / 1e6 / kWindow;
    }
  }
  // Step intervals: between a rank's first and last arrival of the window.
  const uint64_t first = job.steps.begin()->first;
  const uint64_t last = job.steps.rbegin()->first;
  auto when = [&](uint64_t step, uint32_t rank) -> int64_t {
    for (const proto::RankArrival& a : job.steps.at(step)) {
      if (a.rank() == rank) return a.staged_unix_micros();
    }
    return 0;
  };
  std::vector<double> intervals;
  for (auto& [rank, f] : ranks) {
    const int64_t a = when(first, rank), b = when(last, rank);
    if (a != 0 && b != 0) {
      f.interval_s =
          static_cast<double>(b - a) / 1e6 / static_cast<double>(last - first);
    }
    intervals.push_back(f.interval_s);
  }
  std::sort(intervals.begin(), intervals.end());
  std::vector<Flag> flagged;
  for (auto& [rank, f] : ranks) {
    if (f.tail_steps < kTailSteps) continue;
    f.job_interval_s = intervals[intervals.size() / 2];
    flagged.push_back(f);
  }
  return flagged;
}

void Stragglers::Export(const std::string& job, const std::vector<Flag>& before,
                        const std::vector<Flag>& now) {
  auto labels = [&job](const Flag& f) -> Labels {
    return {{"job", job}, {"rank", absl::StrCat(f.rank)}, {"node", f.node}};
  };
  for (const Flag& f : before) {
    metrics_->Set("ckpt_straggler_lag_seconds", labels(f), 0);
  }
  for (const Flag& f : now) {
    metrics_->Set("ckpt_straggler_lag_seconds", labels(f), f.mean_lag_s);
  }
  metrics_->Set("ckpt_stragglers", {{"job", job}},
                static_cast<double>(now.size()));
}

std::vector<Stragglers::Flag> Stragglers::Flagged(
    const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  return it == jobs_.end() ? std::vector<Flag>() : it->second.flagged;
}

}  // namespace ckpt::daemon
