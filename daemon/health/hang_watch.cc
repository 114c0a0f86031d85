#include "daemon/health/hang_watch.h"

#include <algorithm>

namespace ckpt::daemon {

void HangWatch::SessionBegun(const std::string& job, uint32_t rank,
                             uint32_t pid, absl::Time at) {
  absl::MutexLock lock(&mu_);
  Rank& r = jobs_[job].ranks[rank];
  r.pids.insert(pid);
  r.active = std::max(r.active, at);
}

void HangWatch::SessionEnded(const std::string& job, uint32_t rank,
                             uint32_t pid) {
  absl::MutexLock lock(&mu_);
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return;
  auto r = j->second.ranks.find(rank);
  if (r == j->second.ranks.end()) return;
  if (auto it = r->second.pids.find(pid); it != r->second.pids.end())
    r->second.pids.erase(it);
  if (r->second.pids.empty()) r->second.hung = false;
}

void HangWatch::Saved(const std::string& job, uint32_t rank, uint64_t step,
                      absl::Time at) {
  absl::MutexLock lock(&mu_);
  Job& j = jobs_[job];
  Rank& r = j.ranks[rank];
  // The silence of a hang is no save interval.
  if (r.last_save != absl::InfinitePast() && at > r.last_save && !r.hung) {
    const double dt = absl::ToDoubleSeconds(at - r.last_save);
    j.interval_s = j.interval_s == 0 ? dt : 0.9 * j.interval_s + 0.1 * dt;
  }
  r.last_save = std::max(r.last_save, at);
  r.last_step = step;
  r.active = std::max(r.active, at);
  r.hung = false;
  ++r.in_calls;
}

void HangWatch::Alive(const std::string& job, uint32_t rank, absl::Time at) {
  absl::MutexLock lock(&mu_);
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return;
  auto r = j->second.ranks.find(rank);
  if (r != j->second.ranks.end())
    r->second.active = std::max(r->second.active, at);
}

void HangWatch::WaitBegun(const std::string& job, uint64_t step) {
  absl::MutexLock lock(&mu_);
  jobs_[job].waited.insert(step);
}

void HangWatch::WaitEnded(const std::string& job, uint64_t step,
                          absl::Time at) {
  absl::MutexLock lock(&mu_);
  Job& j = jobs_[job];
  if (auto it = j.waited.find(step); it != j.waited.end()) j.waited.erase(it);
  for (auto& [rank, r] : j.ranks) {
    if (r.last_step >= step) r.active = std::max(r.active, at);
  }
}

void HangWatch::Done(const std::string& job, uint32_t rank, absl::Time at) {
  absl::MutexLock lock(&mu_);
  Rank& r = jobs_[job].ranks[rank];
  r.in_calls = std::max(0, r.in_calls - 1);
  r.active = std::max(r.active, at);
}

std::vector<HangWatch::Hung> HangWatch::Check(absl::Time now) {
  std::vector<Hung> out;
  if (after_ == absl::InfiniteDuration()) return out;
  absl::MutexLock lock(&mu_);
  // Much later than the last look: ckptd itself was stopped or starved, and
  // the trainers could not reach it meanwhile.
  const absl::Duration paused = std::max(absl::Seconds(1), after_ / 2);
  const bool resumed =
      checked_ != absl::InfinitePast() && now - checked_ > paused;
  checked_ = now;
  for (auto& [name, j] : jobs_) {
    const absl::Duration interval = absl::Seconds(j.interval_s);
    const absl::Duration limit = std::max(after_, kIntervals * interval);
    for (auto& [rank, r] : j.ranks) {
      if (resumed) {
        r.active = now;
        r.last_save = absl::InfinitePast();  // no interval across the pause
      }
      const bool waiting =
          !j.waited.empty() && r.last_step >= *j.waited.begin();
      if (r.pids.empty() || r.hung || r.in_calls > 0 || waiting ||
          now - r.active < limit) {
        continue;
      }
      r.hung = true;
      out.push_back({name, rank, *r.pids.begin(), now - r.active, interval});
    }
  }
  return out;
}

}  // namespace ckpt::daemon
