// Runs on a machine with a GPU (label `gpu`); skips visibly elsewhere.
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "tests/kernels/device_test_util.h"

namespace ckpt::kernels {
namespace {

TEST(GpuDeviceTest, CudaShuffleMatchesCpuReference) {
  if (!CudaCompiledIn()) GTEST_SKIP() << "built without CUDA";
  auto cuda = NewCudaDevice(0);
  if (!cuda.ok()) GTEST_SKIP() << "no usable GPU: " << cuda.status();
  ExpectShuffleMatchesReference(cuda->get(), testing::TestSeed());
}

// The GPU's XXH3 kernel (one warp per chunk), bit for bit the CPU's.
TEST(GpuDeviceTest, CudaChunkHashesMatchCpuReference) {
  if (!CudaCompiledIn()) GTEST_SKIP() << "built without CUDA";
  auto cuda = NewCudaDevice(0);
  if (!cuda.ok()) GTEST_SKIP() << "no usable GPU: " << cuda.status();
  ExpectHashChunksMatchReference(cuda->get(), testing::TestSeed());
}

// A batched gather and a batch of chunk hashes (one launch each over
// hundreds of tensors), bit for bit the CPU's.
TEST(GpuDeviceTest, CudaBatchesMatchCpuReference) {
  if (!CudaCompiledIn()) GTEST_SKIP() << "built without CUDA";
  auto cuda = NewCudaDevice(0);
  if (!cuda.ok()) GTEST_SKIP() << "no usable GPU: " << cuda.status();
  ExpectBatchesMatchReference(cuda->get(), testing::TestSeed());
}

}  // namespace
}  // namespace ckpt::kernels
