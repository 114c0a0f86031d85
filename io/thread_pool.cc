#include "io/thread_pool.h"

#include <system_error>

#include "io/logging.h"

namespace ckpt::io {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) threads = 1;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) {
    try {
      threads_.emplace_back([this] { Loop(); });
    } catch (const std::system_error& e) {
      // The system refuses more threads: the pool runs on those it got. With
      // none, the error is the caller's (nothing to join).
      if (threads_.empty()) throw;
      CKPT_LOG_WARN("a pool of {} thread(s) instead of {}: {}", threads_.size(),
                    threads, e.what());
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> fn) {
  absl::MutexLock l(&mu_);
  queue_.push_back(std::move(fn));
}

void ThreadPool::Loop() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stopping_ || !p->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace ckpt::io
