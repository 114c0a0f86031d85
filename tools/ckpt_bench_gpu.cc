// `ckpt-bench gpu`: the GPU snapshot path's kernels and copies against the
// CUDA runtime's own copies, in the same run, on one GPU (issue #16):
//   d2h_vs_memcpy_large: the device's CopyToHost of --size-mib from device
//     memory into a staging slot (a tmpfs mapping, registered once) against
//     cudaMemcpyAsync into cudaMallocHost memory;
//   h2d_registered_slot_vs_memcpy: CopyFromHost from that slot against
//     cudaMemcpyAsync from pinned memory;
//   hash_vs_d2d: the chunk checksums (HashChunks, 4 MiB chunks) against a
//     device-to-device copy of the same bytes;
//   shuffle_vs_d2d: ByteShuffle of 4-byte elements against the same copy.
//   d2h_vs_memcpy_small: 2000 tensors of 4 KiB-1 MiB staged by libckpt's
//     DeviceStager (gathered) against one pinned copy of as many bytes
//     (tools/ckpt_bench_gpu_save.cc);
//   host_stall_ms: SaveAsync's host time for --size-mib of device tensors,
//     against a ckptd of the benchmark's own in --dir;
//   restore_h2d_vs_memcpy: Checkpointer::Restore of that state from the
//     memory tier into device memory (every chunk checked) against
//     cudaMemcpyAsync from pinned memory.
// Each is the median of --runs; the throughputs are in GiB/s.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/device.h"
#include "nlohmann/json.hpp"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"

#if CKPT_HAVE_CUDA
#include <cuda_runtime.h>

#include "tools/ckpt_bench_gpu.h"
#endif

namespace ckpt::bench {

#if CKPT_HAVE_CUDA
namespace gpu {

using tools::Median;
using tools::Seconds;

bool Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::cerr << "ckpt-bench gpu: " << what << ": " << cudaGetErrorString(err)
            << "\n";
  return false;
}

Slot::Slot(size_t n) : bytes(n) {
  static int slots = 0;
  path = absl::StrCat("/dev/shm/ckpt-bench-gpu-", ::getpid(), "-", ++slots);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(n)) != 0) return;
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p != MAP_FAILED) data = static_cast<uint8_t*>(p);
}

Slot::~Slot() {
  if (data != nullptr) ::munmap(data, bytes);
  ::unlink(path.c_str());
}

double Rate(size_t bytes, int runs, const std::function<bool()>& op) {
  std::vector<double> rates;
  if (!op()) return 0;  // warm-up
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (!op()) return 0;
    rates.push_back(static_cast<double>(bytes) / Seconds(start) / (1 << 30));
  }
  return Median(rates);
}

}  // namespace gpu

int RunGpu(const std::string& dir, uint64_t size_mib, int runs, bool json) {
  using namespace gpu;  // NOLINT: the helpers of this benchmark
  absl::StatusOr<std::unique_ptr<kernels::Device>> device =
      kernels::NewCudaDevice(0);
  if (!device.ok()) {
    std::cerr << "ckpt-bench gpu: " << device.status() << "\n";
    return 1;
  }
  kernels::Device& d = **device;
  const size_t n = static_cast<size_t>(size_mib) << 20;
  void* src = nullptr;
  void* dst = nullptr;
  void* pinned = nullptr;
  if (!Check(cudaMalloc(&src, n), "cudaMalloc") ||
      !Check(cudaMalloc(&dst, n), "cudaMalloc") ||
      !Check(cudaMallocHost(&pinned, n), "cudaMallocHost") ||
      !Check(cudaMemset(src, 0x5a, n), "cudaMemset") ||
      !Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) {
    return 1;
  }
  Slot slot(n);
  if (slot.data == nullptr) {
    std::cerr << "ckpt-bench gpu: no " << size_mib << " MiB slot on /dev/shm\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<kernels::HostRegistration>> registered =
      d.RegisterHost(slot.data, n);
  if (!registered.ok()) {
    std::cerr << "ckpt-bench gpu: " << registered.status() << "\n";
    return 1;
  }
  cudaStream_t stream;
  if (!Check(cudaStreamCreate(&stream), "cudaStreamCreate")) return 1;
  auto ours = [&](absl::Status s) { return s.ok() && d.Synchronize().ok(); };
  auto theirs = [&](cudaError_t err) {
    return Check(err, "cudaMemcpyAsync") &&
           Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  };
  constexpr size_t kChunk = 4 << 20;
  std::vector<uint64_t> hashes((n + kChunk - 1) / kChunk);

  const double d2h =
      Rate(n, runs, [&] { return ours(d.CopyToHost(src, slot.data, n)); });
  const double d2h_ref = Rate(n, runs, [&] {
    return theirs(
        cudaMemcpyAsync(pinned, src, n, cudaMemcpyDeviceToHost, stream));
  });
  const double h2d =
      Rate(n, runs, [&] { return ours(d.CopyFromHost(slot.data, dst, n)); });
  const double h2d_ref = Rate(n, runs, [&] {
    return theirs(
        cudaMemcpyAsync(dst, pinned, n, cudaMemcpyHostToDevice, stream));
  });
  // The save path's hashes: one batch over every chunk (PrepareHashes, as
  // DeviceStager), and HashChunks' launch per call.
  absl::StatusOr<std::unique_ptr<kernels::Batch>> batch =
      d.PrepareHashes({{src, n}}, kChunk);
  const double hash = !batch.ok() ? 0 : Rate(n, runs, [&] {
    return ours(d.HashBatch(**batch, hashes.data()));
  });
  const double hash_chunks = Rate(n, runs, [&] {
    return ours(d.HashChunks(src, n, kChunk, hashes.data()));
  });
  if (!batch.ok()) std::cerr << "ckpt-bench gpu: " << batch.status() << "\n";
  batch = absl::InternalError("released");
  const double shuffle =
      Rate(n, runs, [&] { return ours(d.ByteShuffle(src, dst, n, 4)); });
  const double d2d = Rate(n, runs, [&] {
    return theirs(
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream));
  });
  cudaStreamDestroy(stream);
  registered->reset();
  cudaFreeHost(pinned);
  cudaFree(src);
  cudaFree(dst);
  if (d2h == 0 || d2h_ref == 0 || h2d == 0 || h2d_ref == 0 || hash == 0 ||
      shuffle == 0 || d2d == 0) {
    std::cerr << "ckpt-bench gpu: a measurement failed\n";
    return 1;
  }
  // A later part that fails leaves the figures of the others (a GPU machine
  // is lent for minutes): it is named under "failed" and the exit status is 1.
  std::vector<std::string> failed;
  SmallCopies small;
  if (!MeasureSmallCopies(runs, &small)) {
    std::cerr << "ckpt-bench gpu: the small tensors' copies failed\n";
    failed.push_back("d2h_vs_memcpy_small");
  }
  HostStall stall;
  if (!MeasureHostStall(dir, size_mib, std::min(runs, 3), &stall)) {
    std::cerr << "ckpt-bench gpu: the saves through ckptd failed (see " << dir
              << "/ckptd.log)\n";
    failed.push_back("host_stall_ms");
    failed.push_back("restore_h2d_vs_memcpy");
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  nlohmann::json j;
  j["benchmark"] = "gpu";
  j["device"] = prop.name;
  j["size_mib"] = size_mib;
  j["runs"] = runs;
  j["d2h_gib_s"] = d2h;
  j["d2h_memcpy_pinned_gib_s"] = d2h_ref;
  j["d2h_vs_memcpy_large"] = d2h / d2h_ref;
  j["h2d_gib_s"] = h2d;
  j["h2d_memcpy_pinned_gib_s"] = h2d_ref;
  j["h2d_registered_slot_vs_memcpy"] = h2d / h2d_ref;
  j["hash_gib_s"] = hash;
  j["hash_chunks_gib_s"] = hash_chunks;
  j["shuffle_gib_s"] = shuffle;
  j["d2d_gib_s"] = d2d;
  j["hash_vs_d2d"] = hash / d2d;
  j["shuffle_vs_d2d"] = shuffle / d2d;
  j["small_tensors"] = small.tensors;
  j["small_bytes"] = small.bytes;
  j["small_gathered_gib_s"] = small.gathered_gib_s;
  j["small_per_tensor_gib_s"] = small.per_tensor_gib_s;
  j["small_memcpy_pinned_gib_s"] = small.memcpy_gib_s;
  if (small.memcpy_gib_s > 0) {
    j["d2h_vs_memcpy_small"] = small.gathered_gib_s / small.memcpy_gib_s;
    j["d2h_small_per_tensor_vs_memcpy"] =
        small.per_tensor_gib_s / small.memcpy_gib_s;
  }
  if (stall.staged_gib_s > 0) {
    j["host_stall_ms"] = stall.stall_ms;
    j["first_save_stall_ms"] = stall.first_stall_ms;
    j["save_staged_gib_s"] = stall.staged_gib_s;
    j["restore_memory_gib_s"] = stall.restore_gib_s;
    j["restore_h2d_vs_memcpy"] = stall.restore_gib_s / h2d_ref;
  }
  j["failed"] = failed;
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf(
        "%s, %llu MiB, median of %d (GiB/s):\n"
        "  D2H into a registered slot %.1f, cudaMemcpy into pinned %.1f: "
        "%.2f\n"
        "  H2D from the slot %.1f, from pinned %.1f: %.2f\n"
        "  chunk hashes %.1f, shuffle %.1f, D2D copy %.1f: %.2f, %.2f\n"
        "  %llu small tensors gathered %.1f, each copied %.1f, one pinned "
        "copy %.1f: %.2f\n"
        "  SaveAsync host time %.2f ms (first save %.1f ms), staged at "
        "%.1f; restore from memory %.1f: %.2f\n",
        prop.name, static_cast<unsigned long long>(size_mib), runs, d2h,
        d2h_ref, d2h / d2h_ref, h2d, h2d_ref, h2d / h2d_ref, hash, shuffle, d2d,
        hash / d2d, shuffle / d2d,
        static_cast<unsigned long long>(small.tensors), small.gathered_gib_s,
        small.per_tensor_gib_s, small.memcpy_gib_s,
        small.gathered_gib_s / small.memcpy_gib_s, stall.stall_ms,
        stall.first_stall_ms, stall.staged_gib_s, stall.restore_gib_s,
        stall.restore_gib_s / h2d_ref);
  }
  return failed.empty() ? 0 : 1;
}

#else

int RunGpu(const std::string&, uint64_t, int, bool) {
  std::cerr << "ckpt-bench gpu: built without CUDA\n";
  return 1;
}

#endif

}  // namespace ckpt::bench
