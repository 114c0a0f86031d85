#include "io/parallel.h"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

#include "io/logging.h"

namespace ckpt::io {

int RunOnThreads(int helpers, const std::function<void()>& work) {
  std::vector<std::thread> started;
  started.reserve(static_cast<size_t>(std::max(helpers, 0)));
  for (int t = 0; t < helpers; ++t) {
    try {
      started.emplace_back(work);
    } catch (const std::system_error& e) {
      CKPT_LOG_WARN("running on {} thread(s) instead of {}: {}",
                    started.size() + 1, helpers + 1, e.what());
      break;
    }
  }
  work();
  for (std::thread& t : started) t.join();
  return static_cast<int>(started.size()) + 1;
}

void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&fn, &next, n] {
    for (size_t i = next++; i < n; i = next++) fn(i);
  };
  threads = static_cast<int>(std::clamp<size_t>(
      static_cast<size_t>(std::max(threads, 1)), 1, std::max<size_t>(1, n)));
  RunOnThreads(threads - 1, work);
}

}  // namespace ckpt::io
