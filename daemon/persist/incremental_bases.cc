#include "daemon/persist/incremental_bases.h"

#include "absl/strings/str_cat.h"
#include "daemon/common/describe.h"

namespace ckpt::daemon {

void IncrementalBases::Remember(const std::string& job, uint32_t rank,
                                uint64_t step, Base base) {
  absl::MutexLock lock(&mu_);
  auto& mine = bases_[{job, rank}];
  mine[step] = std::move(base);
  while (mine.size() > kCandidates) mine.erase(mine.begin());
}

void IncrementalBases::Replace(const std::string& job, uint32_t rank,
                               uint64_t step, Base base) {
  absl::MutexLock lock(&mu_);
  auto mine = bases_.find({job, rank});
  if (mine == bases_.end()) return;
  auto it = mine->second.find(step);
  if (it != mine->second.end()) it->second = std::move(base);
}

void IncrementalBases::Forget(const std::string& job) {
  absl::MutexLock lock(&mu_);
  for (auto it = bases_.begin(); it != bases_.end();) {
    it = it->first.first == job ? bases_.erase(it) : std::next(it);
  }
}

std::vector<IncrementalBases::Base> IncrementalBases::Candidates(
    const std::string& job, uint32_t rank) const {
  std::vector<Base> newest_first;
  absl::MutexLock lock(&mu_);
  auto it = bases_.find({job, rank});
  if (it == bases_.end()) return newest_first;
  for (auto c = it->second.rbegin(); c != it->second.rend(); ++c)
    newest_first.push_back(c->second);
  return newest_first;
}

bool IncrementalBases::Pin(const std::string& job, uint32_t rank, uint64_t step,
                           absl::FunctionRef<bool()> still_there) {
  absl::MutexLock pins(&pin_mu_);
  if (!still_there()) return false;
  ++pinned_[{job, rank, step}];
  return true;
}

void IncrementalBases::Unpin(const std::string& job, uint32_t rank,
                             uint64_t step) {
  absl::MutexLock pins(&pin_mu_);
  auto it = pinned_.find({job, rank, step});
  if (it != pinned_.end() && --it->second == 0) pinned_.erase(it);
}

std::set<std::pair<uint32_t, uint64_t>> IncrementalBases::Pinned(
    const std::string& job) const {
  std::set<std::pair<uint32_t, uint64_t>> pinned;
  absl::MutexLock pins(&pin_mu_);
  for (auto it = pinned_.lower_bound({job, 0, 0});
       it != pinned_.end() && std::get<0>(it->first) == job; ++it) {
    pinned.insert({std::get<1>(it->first), std::get<2>(it->first)});
  }
  return pinned;
}

absl::Status IncrementalBases::WaitUnpinned(const std::string& job,
                                            uint32_t rank, uint64_t step,
                                            absl::Duration timeout) const {
  absl::MutexLock pins(&pin_mu_);
  auto unpinned = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pin_mu_) {
    return pinned_.count({job, rank, step}) == 0;
  };
  if (pin_mu_.AwaitWithTimeout(absl::Condition(&unpinned), timeout)) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat(Describe(job, step, rank),
                   " is still the base of a persist in flight after ",
                   absl::FormatDuration(timeout)));
}

IncrementalBases::Freeze::Freeze(const IncrementalBases& bases)
    : bases_(bases) {
  bases_.pin_mu_.Lock();
}

IncrementalBases::Freeze::~Freeze() { bases_.pin_mu_.Unlock(); }

bool IncrementalBases::Freeze::Pinned(const std::string& job, uint32_t rank,
                                      uint64_t step) const {
  bases_.pin_mu_.AssertHeld();
  return bases_.pinned_.count({job, rank, step}) > 0;
}

}  // namespace ckpt::daemon
