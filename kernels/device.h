// Device is where a trainer's tensors live and where the snapshot path's
// data-parallel steps (copy into the staging slot, byte-shuffle, chunk hash)
// run. CpuDevice is always available and is the reference: every other device
// must produce identical bytes. CudaDevice exists when the project is built
// with CUDA; NewCudaDevice() then returns an error on machines without a GPU.
//
// A save on a device with streams never blocks the trainer's host thread:
//   device->WaitForStream(compute);        // the copy sees the step's results
//   device->CopyToHost(tensor, slot, n);   // queued on the device's own stream
//   auto done = device->RecordEvent();
//   device->StreamWaitEvent(compute, **done);  // later kernels wait for the
//   copy
// and a helper thread calls done->Wait() before handing the slot to ckptd.
// Staging slots are pinned once (RegisterHost) and kept registered while the
// client reuses them, because pinning costs far more than one copy.
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
#include "absl/types/span.h"
#include "kernels/batch.h"

namespace ckpt::kernels {

// Host memory registered with a device (pinned for DMA) until destroyed.
class HostRegistration {
 public:
  virtual ~HostRegistration() = default;
};

// A point in a device's copy stream: everything queued before it.
class Event {
 public:
  virtual ~Event() = default;
  // Blocks the calling thread until the work before the event is done, and
  // returns its error if it failed.
  virtual absl::Status Wait() = 0;
};

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
  // The XXH3-64 (XXH3_64bits) of every `chunk`-byte piece of device memory
  // [src, src + n), the last one shorter if n is not a multiple, into host
  // memory `hashes` (ceil(n / chunk) of them; complete after Synchronize()):
  // a shard's raw-chunk checksums, taken while the bytes are on the device.
  // Identical to snapshot::Checksum of each piece.
  virtual absl::Status HashChunks(const void* src, size_t n, size_t chunk,
                                  uint64_t* hashes) = 0;
  // Prepares a gather of `pieces` (device memory) into one destination
  // (kernels/batch.h): its table is copied to the device once, here, and
  // run by Gather as often as wanted.
  virtual absl::StatusOr<std::unique_ptr<Batch>> PrepareGather(
      absl::Span<const GatherPiece> pieces) = 0;
  // Copies every piece of `gather` to its offset in device memory `dst`
  // (gather.outputs() bytes), with one launch.
  virtual absl::Status Gather(const Batch& gather, void* dst) = 0;
  // Prepares the chunk hashes of `runs` (device memory) in `chunk`-byte
  // pieces, numbered run after run.
  virtual absl::StatusOr<std::unique_ptr<Batch>> PrepareHashes(
      absl::Span<const HashRun> runs, size_t chunk) = 0;
  // Writes the hashes of `hashes_batch` into host memory `hashes`
  // (outputs() of them; complete after Synchronize()), with one launch.
  // Identical to snapshot::Checksum of each piece.
  virtual absl::Status HashBatch(const Batch& hashes_batch,
                                 uint64_t* hashes) = 0;
  // Waits for everything queued on this device.
  virtual absl::Status Synchronize() = 0;

  // True when tensors of this device are plain host memory.
  virtual bool host_resident() const = 0;
  // True when copies are queued and complete later (see the header comment);
  // false when CopyToHost has finished when it returns.
  virtual bool queues_copies() const = 0;
  // Pins [p, p + n) for copies from and to this device (cudaHostRegister). The
  // CPU device has nothing to do.
  virtual absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHost(
      void* p, size_t n) = 0;
  // Records the work queued so far on this device's stream.
  virtual absl::StatusOr<std::unique_ptr<Event>> RecordEvent() = 0;
  // Orders this device's later work after what is queued now on `stream`, an
  // opaque stream handle of the device's API (a cudaStream_t; null is the
  // default stream). The CPU device ignores it.
  virtual absl::Status WaitForStream(void* stream) = 0;
  // Makes later work on `stream` wait for `event` without blocking the host.
  virtual absl::Status StreamWaitEvent(void* stream, Event& event) = 0;

  // Allocates and frees device memory (host memory for the CPU device).
  virtual absl::StatusOr<void*> Allocate(size_t n) = 0;
  virtual void Free(void* p) = 0;
};

std::unique_ptr<Device> NewCpuDevice();
// The CPU twin of the CUDA device's stream (queued_cpu_device.cc): host memory
// as device memory, its work queued on a thread of its own and completed
// later, chunk hashes with the GPU kernel's arithmetic. For tests of the GPU
// paths without a GPU.
std::unique_ptr<Device> NewQueuedCpuDevice();
// The same, refusing device allocations above `max_allocation` bytes as a GPU
// out of memory would (tests of the fallbacks).
std::unique_ptr<Device> NewQueuedCpuDevice(size_t max_allocation);

// True when this build includes the CUDA device.
bool CudaCompiledIn();
// The CUDA device `ordinal`; an error naming the reason when there is no usable
// GPU.
absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int ordinal = 0);

}  // namespace ckpt::kernels

#endif  // CKPT_KERNELS_DEVICE_H_
