// Device is where a trainer's tensors live and where the snapshot path's
// data-parallel steps (copy into the staging slot, byte-shuffle, chunk hash)
// run. CpuDevice is always available and is the reference: every other device
// must produce identical bytes. CudaDevice exists when the project is built
// with CUDA; NewCudaDevice() then returns an error on machines without a GPU.
//
// Thread-safety: a Device may be used from one thread at a time.
#ifndef CKPT_KERNELS_DEVICE_H_
#define CKPT_KERNELS_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::kernels {

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;

  // Copies `n` bytes from device memory `src` to host memory `dst`
  // (asynchronous on devices with streams; complete after Synchronize()).
  virtual absl::Status CopyToHost(const void* src, void* dst, size_t n) = 0;
  // Copies `n` bytes from host memory `src` to device memory `dst`.
  virtual absl::Status CopyFromHost(const void* src, void* dst, size_t n) = 0;
  // Byte-shuffles `n` bytes of `width`-byte elements, device memory to device
  // memory. Identical to snapshot::ByteShuffle.
  virtual absl::Status ByteShuffle(const void* src, void* dst, size_t n,
                                   size_t width) = 0;
  // Waits for everything queued on this device.
  virtual absl::Status Synchronize() = 0;

  // Allocates and frees device memory (host memory for the CPU device).
  virtual absl::StatusOr<void*> Allocate(size_t n) = 0;
  virtual void Free(void* p) = 0;
};

std::unique_ptr<Device> NewCpuDevice();

// True when this build includes the CUDA device.
bool CudaCompiledIn();
// The CUDA device `ordinal`; an error naming the reason when there is no usable
// GPU.
absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int ordinal = 0);

}  // namespace ckpt::kernels

#endif  // CKPT_KERNELS_DEVICE_H_
