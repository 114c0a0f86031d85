// `ckpt-bench gpu`'s measurements of libckpt's save path on a GPU (issue #16):
// the batched gather of many small tensors (d2h_vs_memcpy_small) and the host
// time of SaveAsync (host_stall_ms). See tools/ckpt_bench_gpu.h.
#if CKPT_HAVE_CUDA
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/device_stager.h"
#include "kernels/device.h"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"
#include "tools/ckpt_bench_gpu.h"

namespace ckpt::bench::gpu {

bool MeasureSmallCopies(int runs, SmallCopies* out) {
  absl::StatusOr<std::unique_ptr<kernels::Device>> device =
      kernels::NewCudaDevice(0);
  if (!device.ok()) {
    std::cerr << "ckpt-bench gpu: " << device.status() << "\n";
    return false;
  }
  kernels::Device& d = **device;
  constexpr int kTensors = 2000;
  std::mt19937_64 rng(20261205);
  client::DeviceStager gathered(&d, {});
  client::DeviceStager per_tensor(&d, {0, 0});
  std::vector<void*> memory;
  std::vector<client::DeviceStager::Tensor> tensors;
  uint64_t bytes = 0, slot_bytes = 0;
  bool ok = true;
  for (int i = 0; ok && i < kTensors; ++i) {
    const size_t n = static_cast<size_t>(
        std::exp2(12 + std::uniform_real_distribution<>(0, 8)(rng)));
    void* p = nullptr;
    ok = Check(cudaMalloc(&p, n), "cudaMalloc") &&
         Check(cudaMemset(p, i & 0xff, n), "cudaMemset");
    memory.push_back(p);
    slot_bytes = (slot_bytes + 63) / 64 * 64;  // as libckpt lays them out
    tensors.push_back({p, n, slot_bytes});
    slot_bytes += n;
    bytes += n;
  }
  void* contiguous = nullptr;
  void* pinned = nullptr;
  cudaStream_t stream = nullptr;
  ok = ok && Check(cudaMalloc(&contiguous, bytes), "cudaMalloc") &&
       Check(cudaMallocHost(&pinned, bytes), "cudaMallocHost") &&
       Check(cudaStreamCreate(&stream), "cudaStreamCreate") &&
       Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  Slot slot(slot_bytes);
  ok = ok && slot.data != nullptr;
  absl::StatusOr<std::unique_ptr<kernels::HostRegistration>> registered =
      ok ? d.RegisterHost(slot.data, slot_bytes)
         : absl::InternalError("no slot");
  ok = ok && registered.ok();
  if (ok) {
    out->tensors = kTensors;
    out->bytes = bytes;
    auto staged = [&](client::DeviceStager& stager) {
      return stager.QueueCopies(tensors, slot.data).ok() &&
             d.Synchronize().ok();
    };
    out->gathered_gib_s = Rate(bytes, runs, [&] { return staged(gathered); });
    out->per_tensor_gib_s =
        Rate(bytes, runs, [&] { return staged(per_tensor); });
    out->memcpy_gib_s = Rate(bytes, runs, [&] {
      return Check(cudaMemcpyAsync(pinned, contiguous, bytes,
                                   cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync") &&
             Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    });
    ok = out->gathered_gib_s > 0 && out->per_tensor_gib_s > 0 &&
         out->memcpy_gib_s > 0 && gathered.stats().tensors_gathered > 0;
    if (!gathered.stats().gather_refused.empty()) {
      std::cerr << "ckpt-bench gpu: " << gathered.stats().gather_refused
                << "\n";
    }
  }
  if (registered.ok()) registered->reset();
  if (stream != nullptr) cudaStreamDestroy(stream);
  cudaFreeHost(pinned);
  cudaFree(contiguous);
  (void)d.Synchronize();
  for (void* p : memory) cudaFree(p);
  return ok;
}

bool MeasureHostStall(const std::string& dir, uint64_t size_mib, int runs,
                      HostStall* out) {
  constexpr uint64_t kTensorMib = 256;
  const std::string staging =
      absl::StrCat("/dev/shm/ckpt-bench-gpu-staging-", ::getpid());
  std::filesystem::create_directories(dir + "/run");
  BenchDaemon guard;
  guard.staging = staging;
  guard.pid = StartDaemon(dir, staging, 3 * size_mib + 256);
  cudaStream_t compute = nullptr;
  if (!Check(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking),
             "cudaStreamCreate")) {
    return false;
  }
  client::CheckpointerOptions options{"gpu-stall", 0, 1,
                                      dir + "/run/ckptd.sock"};
  options.device = client::DeviceKind::kCuda;
  options.compute_stream = compute;
  absl::StatusOr<std::unique_ptr<client::Checkpointer>> ckpt =
      client::Checkpointer::Connect(options);
  std::vector<void*> memory;
  bool ok = ckpt.ok();
  if (!ok) std::cerr << "ckpt-bench gpu: " << ckpt.status() << "\n";
  for (uint64_t at = 0; ok && at < size_mib; at += kTensorMib) {
    const uint64_t n = std::min(kTensorMib, size_mib - at) << 20;
    void* p = nullptr;
    ok = Check(cudaMalloc(&p, n), "cudaMalloc") &&
         Check(cudaMemset(p, static_cast<int>(at & 0xff), n), "cudaMemset");
    memory.push_back(p);
    const int64_t floats = static_cast<int64_t>(n / 4);
    ok = ok &&
         (*ckpt)
             ->RegisterTensor(absl::StrCat("w", memory.size()),
                              proto::DTYPE_FLOAT32, p, {floats}, {0}, {floats})
             .ok();
  }
  ok = ok && Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // Warm-up saves map and pin the slots ckptd then hands out again.
  constexpr int kWarmup = 3;
  std::vector<double> stalls, staged;
  for (int i = 0; ok && i < kWarmup + runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::shared_ptr<client::SaveHandle>> save =
        (*ckpt)->SaveAsync(static_cast<uint64_t>(i + 1));
    const double stall = tools::Seconds(start);
    absl::Status s = save.status();
    if (s.ok()) s = (*save)->WaitStaged();
    const double copied = tools::Seconds(start);
    if (s.ok()) s = (*save)->WaitCommitted(proto::TIER_LOCAL_DISK);
    if (!s.ok()) {
      std::cerr << "ckpt-bench gpu: save " << i + 1 << ": " << s << " (see "
                << dir << "/ckptd.log)\n";
      ok = false;
    }
    if (i == 0) out->first_stall_ms = stall * 1e3;
    if (i >= kWarmup) {
      stalls.push_back(stall * 1e3);
      staged.push_back(static_cast<double>(size_mib) / 1024 / copied);
    }
  }
  if (ok) {
    // The last step is still in the memory tier (--keep-memory 1).
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = (*ckpt)->Restore(static_cast<uint64_t>(kWarmup + runs));
    const double restore = tools::Seconds(start);
    if (!s.ok()) {
      std::cerr << "ckpt-bench gpu: restore: " << s << "\n";
      ok = false;
    }
    out->restore_gib_s = static_cast<double>(size_mib) / 1024 / restore;
  }
  if (ckpt.ok()) ckpt->reset();
  cudaStreamDestroy(compute);
  for (void* p : memory) cudaFree(p);
  if (!ok) return false;
  out->stall_ms = tools::Median(stalls);
  out->staged_gib_s = tools::Median(staged);
  return true;
}

}  // namespace ckpt::bench::gpu

#endif  // CKPT_HAVE_CUDA
