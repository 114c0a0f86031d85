// Helpers the ckpt-bench programs share: elapsed time and medians.
//
// Thread-safety: pure functions, callable from any thread.
#ifndef CKPT_TOOLS_BENCH_STATS_H_
#define CKPT_TOOLS_BENCH_STATS_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace ckpt::tools {

inline double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_BENCH_STATS_H_
