#include "daemon/memory/job_activity.h"

namespace ckpt::daemon {

JobActivity::Job& JobActivity::Find(const std::string& job) {
  auto [it, added] = jobs_.try_emplace(job);
  if (added) it->second.last_save = it->second.detached = started_;
  return it->second;
}

void JobActivity::Attach(const std::string& job) {
  absl::MutexLock lock(&mu_);
  Job& j = Find(job);
  ++j.sessions;
  j.ever_attached = true;
}

void JobActivity::Detach(const std::string& job) {
  absl::MutexLock lock(&mu_);
  Job& j = Find(job);
  if (j.sessions > 0) --j.sessions;
  j.detached = absl::Now();
}

void JobActivity::Saved(const std::string& job, absl::Time when) {
  absl::MutexLock lock(&mu_);
  Job& j = Find(job);
  j.last_save = std::max(j.last_save, when);
}

JobActivity::Job JobActivity::Get(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it != jobs_.end()) return it->second;
  Job unseen;
  unseen.last_save = unseen.detached = started_;
  return unseen;
}

std::map<std::string, JobActivity::Job> JobActivity::All() const {
  absl::MutexLock lock(&mu_);
  return jobs_;
}

}  // namespace ckpt::daemon
