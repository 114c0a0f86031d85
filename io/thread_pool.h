// ThreadPool runs closures on a fixed set of threads. Used by the codec
// pipeline to encode and decode chunks in parallel. Destruction waits for every
// queued closure.
//
// Thread-safety: Schedule() may be called from any thread, including from a
// closure.
#ifndef CKPT_IO_THREAD_POOL_H_
#define CKPT_IO_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::io {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> fn);
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckpt::io

#endif  // CKPT_IO_THREAD_POOL_H_
