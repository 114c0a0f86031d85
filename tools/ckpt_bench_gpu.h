// The helpers `ckpt-bench gpu` (ckpt_bench_gpu.cc) shares with its save-path
// measurements (ckpt_bench_gpu_save.cc). CUDA builds only.
#ifndef CKPT_TOOLS_CKPT_BENCH_GPU_H_
#define CKPT_TOOLS_CKPT_BENCH_GPU_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace ckpt::bench::gpu {

// Prints the error of a CUDA call; false when there was one.
bool Check(cudaError_t err, const char* what);

// A staging slot as ckptd hands them out: a file on tmpfs, mapped shared
// (data is null when it could not be made).
struct Slot {
  explicit Slot(size_t n);
  ~Slot();
  std::string path;
  size_t bytes;
  uint8_t* data = nullptr;
};

// GiB/s of `bytes` moved by `op` (which waits for its work), median of
// `runs` after a warm-up; 0 when `op` failed.
double Rate(size_t bytes, int runs, const std::function<bool()>& op);

// d2h_vs_memcpy_small: 2000 device tensors of 4 KiB to 1 MiB (log-uniform)
// staged into a registered slot by libckpt's DeviceStager (gathered), and
// each copied by itself (not gathered), against one cudaMemcpyAsync of as
// many bytes into pinned memory. GiB/s; false when a step failed.
struct SmallCopies {
  uint64_t tensors = 0, bytes = 0;
  double gathered_gib_s = 0, per_tensor_gib_s = 0, memcpy_gib_s = 0;
};
bool MeasureSmallCopies(int runs, SmallCopies* out);

// host_stall_ms: the host time of Checkpointer::SaveAsync for `size_mib` of
// device tensors (256 MiB each) against the benchmark's own ckptd, with the
// copies ordered on a compute stream, after warm-up saves that map and pin
// the slots; also the first save's (which pins) and the copy's GiB/s; then
// Checkpointer::Restore of the last step from the memory tier into device
// memory (through the pinned buffer, every chunk checked), in GiB/s.
struct HostStall {
  double stall_ms = 0, first_stall_ms = 0, staged_gib_s = 0;
  double restore_gib_s = 0;
};
bool MeasureHostStall(const std::string& dir, uint64_t size_mib, int runs,
                      HostStall* out);

}  // namespace ckpt::bench::gpu

#endif  // CKPT_TOOLS_CKPT_BENCH_GPU_H_
