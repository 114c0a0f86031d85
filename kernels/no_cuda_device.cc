// Built instead of cuda_device.cu when the project is configured without CUDA.
#include "kernels/device.h"

namespace ckpt::kernels {

bool CudaCompiledIn() { return false; }

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int ordinal) {
  return absl::UnimplementedError(
      "this build of ckpt has no CUDA support (nvcc was not found)");
}

}  // namespace ckpt::kernels
