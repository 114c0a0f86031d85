// The training state tools/gen_training_state.py writes (index.json and one
// file of raw tensors per snapshot), loaded for ckpt-bench codec.
#ifndef CKPT_TOOLS_BENCH_TRAINING_STATE_H_
#define CKPT_TOOLS_BENCH_TRAINING_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "io/aligned_buffer.h"
#include "proto/manifest.pb.h"

namespace ckpt::bench {

struct Tensor {
  std::string name;
  proto::DType dtype;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> data;
};

// One snapshot of a run: its bytes (page aligned, as in a staging slot) and
// the tensors in them.
struct Snapshot {
  uint64_t step = 0;
  io::AlignedBuffer bytes;
  std::vector<Tensor> tensors;
  uint64_t raw() const {
    uint64_t n = 0;
    for (const Tensor& t : tensors) n += t.data.size();
    return n;
  }
};

// Prints "ckpt-bench codec: <what>" and exits 1.
[[noreturn]] void Die(const std::string& what);

// The run's snapshots from `dir`/index.json; tensors whose name starts with
// `skip` (if not empty) are left out.
std::vector<Snapshot> LoadRun(const std::string& dir, const std::string& run,
                              const std::string& skip = "");

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_BENCH_TRAINING_STATE_H_
