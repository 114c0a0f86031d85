// libckpt's CUDA device against a real ckptd (label `gpu`; skips visibly on
// machines without a GPU): tensors in device memory are saved through pinned
// staging slots, the trainer's compute stream is ordered after the copy, and
// Restore brings the bytes back into device memory.
#include <cstring>
#include <vector>

#include "client/checkpointer.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "tests/client/daemon_process.h"
#include "tests/test_util.h"
#ifdef CKPT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ckpt::client {
namespace {

#ifdef CKPT_HAVE_CUDA
#define ASSERT_CUDA(expr)                                                      \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

TEST(CheckpointerGpuTest, SavesDeviceTensorsOrderedOnTheComputeStream) {
  auto probe = kernels::NewCudaDevice(0);
  if (!probe.ok()) GTEST_SKIP() << "no usable GPU: " << probe.status();
  testing::DaemonProcess daemon({"--keep-memory", "2"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();

  constexpr size_t kFloats = 16 << 20;  // 64 MiB
  const size_t bytes = kFloats * sizeof(float);
  std::vector<float> host(kFloats);
  for (size_t i = 0; i < kFloats; ++i) host[i] = static_cast<float>(i % 9973);
  float* tensor = nullptr;
  ASSERT_CUDA(cudaMalloc(&tensor, bytes));
  cudaStream_t compute;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaMemcpy(tensor, host.data(), bytes, cudaMemcpyHostToDevice));

  CheckpointerOptions options{"gpujob", 0, 1, daemon.socket()};
  options.device = DeviceKind::kCuda;
  options.compute_stream = compute;
  auto ckpt = Checkpointer::Connect(options);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_TRUE((*ckpt)
                  ->RegisterTensor("w", proto::DTYPE_FLOAT32, tensor,
                                   {static_cast<int64_t>(kFloats)}, {0},
                                   {static_cast<int64_t>(kFloats)})
                  .ok());
  for (uint64_t step = 1; step <= 3; ++step) {
    auto save = (*ckpt)->SaveAsync(step);
    ASSERT_TRUE(save.ok()) << save.status();
    // The next "kernel" overwrites the state at once, without WaitStaged: it
    // must run after the copy because the stream waits for it.
    ASSERT_CUDA(cudaMemsetAsync(tensor, 0xff, bytes, compute));
    ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
    ASSERT_CUDA(cudaStreamSynchronize(compute));
    ASSERT_CUDA(cudaMemcpy(tensor, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  EXPECT_GE((*ckpt)->stats().slots_reused, 1u) << "pinned slots are reused";
  // 64 MiB in 4 MiB chunks, three saves: hashed by the GPU's kernel, and
  // good, or the restores below would fail their checks.
  EXPECT_EQ((*ckpt)->stats().chunks_hashed_on_device, 3u * 16u);

  ASSERT_CUDA(cudaMemset(tensor, 0, bytes));
  ASSERT_TRUE((*ckpt)->Restore(3).ok());
  std::vector<float> back(kFloats);
  ASSERT_CUDA(cudaMemcpy(back.data(), tensor, bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back.data(), host.data(), bytes), 0)
      << "memory-tier restore into device memory";

  // The shard file path: the slot is dropped from the memory tier first.
  auto shard = (*ckpt)->DescribeShard(1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  if (shard->slot_path().empty()) {
    ASSERT_CUDA(cudaMemset(tensor, 0, bytes));
    ASSERT_TRUE((*ckpt)->Restore(1).ok());
    ASSERT_CUDA(cudaMemcpy(back.data(), tensor, bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(back.data(), host.data(), bytes), 0)
        << "disk restore into device memory";
  }
  ckpt->reset();
  cudaStreamDestroy(compute);
  cudaFree(tensor);
}
#else
TEST(CheckpointerGpuTest, SavesDeviceTensorsOrderedOnTheComputeStream) {
  GTEST_SKIP() << "built without CUDA";
}
#endif

}  // namespace
}  // namespace ckpt::client
