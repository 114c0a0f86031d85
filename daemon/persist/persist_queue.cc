#include "daemon/persist/persist_queue.h"

#include <algorithm>

namespace ckpt::daemon {

std::vector<SlotId> PersistQueue::Add(const SlotId& id, bool newest_only) {
  absl::MutexLock lock(&mu_);
  std::vector<SlotId> skipped;
  if (newest_only) {
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->job == id.job && it->rank == id.rank && it->step < id.step) {
        skipped.push_back(*it);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  queue_.push_back(id);
  return skipped;
}

void PersistQueue::RequestGc(const std::string& job) {
  absl::MutexLock lock(&mu_);
  gc_wanted_.insert(job);
}

std::deque<SlotId>::iterator PersistQueue::FirstReady() {
  return std::find_if(queue_.begin(), queue_.end(), [this](const SlotId& q) {
    mu_.AssertHeld();
    return busy_.count({q.job, q.rank}) == 0;
  });
}

std::optional<PersistQueue::Work> PersistQueue::Next() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || FirstReady() != queue_.end() || !gc_wanted_.empty();
  };
  mu_.Await(absl::Condition(&ready));
  if (stopping_) return std::nullopt;
  Work work;
  if (auto it = FirstReady(); it != queue_.end()) {
    work.shard = *it;
    queue_.erase(it);
    busy_[{work.shard->job, work.shard->rank}] = work.shard->step;
  } else {
    work.gc_job = *gc_wanted_.begin();
    gc_wanted_.erase(gc_wanted_.begin());
    ++gc_running_;
  }
  return work;
}

void PersistQueue::Done(const SlotId& id) {
  absl::MutexLock lock(&mu_);
  busy_.erase({id.job, id.rank});
  gc_wanted_.insert(id.job);
}

void PersistQueue::GcDone() {
  absl::MutexLock lock(&mu_);
  --gc_running_;
}

bool PersistQueue::Withdraw(const SlotId& id) {
  absl::MutexLock lock(&mu_);
  auto it = std::find(queue_.begin(), queue_.end(), id);
  const bool was_queued = it != queue_.end();
  if (was_queued) queue_.erase(it);
  auto not_in_flight = [this, &id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto b = busy_.find({id.job, id.rank});
    return b == busy_.end() || b->second != id.step;
  };
  mu_.Await(absl::Condition(&not_in_flight));
  return was_queued;
}

bool PersistQueue::Persisting() const {
  absl::MutexLock lock(&mu_);
  return !busy_.empty();
}

void PersistQueue::WaitIdle() const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && busy_.empty() && gc_running_ == 0 &&
           gc_wanted_.empty();
  };
  mu_.Await(absl::Condition(&idle));
}

void PersistQueue::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

bool PersistQueue::WaitForStop(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&stopping_), timeout);
}

}  // namespace ckpt::daemon
