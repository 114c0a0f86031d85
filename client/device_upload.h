// Restores into device memory (issue #16): bytes reach the device through a
// pinned host buffer, half of it at a time, and each half is copied to the
// device on its stream while the other half is filled, so the host's reading,
// decoding or checking and the host-to-device link work at once.
//   - UploadFromShard fills the halves from a shard file: tensors that fit a
//     half are read together (one ShardReader pass keeps the disk busy across
//     small items), larger ones in ranges of a half.
//   - UploadFromHost fills them from host memory (a memory-tier slot) on
//     several threads and checks each run where it landed, so what reaches the
//     device is what was verified, in one pass over the slot.
//
// The buffer is allocated and pinned for one restore and released after it:
// restores are rare, and pinned memory kept for the whole run would be taken
// from the trainer.
#ifndef CKPT_CLIENT_DEVICE_UPLOAD_H_
#define CKPT_CLIENT_DEVICE_UPLOAD_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/device.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {

// Two pinned host buffers of `half` bytes used in turn to bring bytes to a
// device: Fill(k) returns half k % 2 once the copies queued from it before
// are done; the caller fills it, queues its copies to the device, and
// Send(k) records them. Destroying it waits for the device's queued work.
class PinnedHalves {
 public:
  PinnedHalves(kernels::Device* device, uint64_t half);
  ~PinnedHalves();
  // Allocates and pins; an allocation failure is an error, a pinning failure
  // only slower copies (logged).
  absl::Status Pin();
  absl::StatusOr<uint8_t*> Fill(size_t k);
  absl::Status Send(size_t k);
  // Waits for every queued copy.
  absl::Status Finish();
  uint64_t half() const { return half_; }

 private:
  kernels::Device* const device_;
  const uint64_t half_;
  std::unique_ptr<uint8_t, decltype(&std::free)> buffer_;
  std::unique_ptr<kernels::HostRegistration> pinned_;
  std::unique_ptr<kernels::Event> sent_[2];
};

struct UploadTensor {
  std::string name;  // the item in the shard file
  void* dst;         // device memory
  uint64_t bytes;    // its raw size
};

// Reads every tensor of `tensors` from `reader` into device memory through a
// pinned buffer of at most `buffer_bytes`; returns once the copies are done.
// A failure may leave the tensors partly written.
absl::Status UploadFromShard(kernels::Device* device,
                             snapshot::ShardReader& reader,
                             const std::vector<UploadTensor>& tensors,
                             uint64_t buffer_bytes);

// `bytes` of host memory at `src`, for device memory at `dst`.
struct HostRun {
  const uint8_t* src;
  void* dst;
  uint64_t bytes;
};
// Checks run `i` where it landed in the pinned buffer; an error stops the
// upload and is returned.
using CheckLanded =
    std::function<absl::Status(size_t i, absl::Span<const uint8_t> landed)>;

// Copies every run into device memory through a pinned buffer of at most
// `buffer_bytes` (at least the largest run), checking each with `check`
// before it leaves for the device; returns once the copies are done. A
// failure may leave the destinations partly written.
absl::Status UploadFromHost(kernels::Device* device,
                            const std::vector<HostRun>& runs,
                            const CheckLanded& check, uint64_t buffer_bytes);

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_DEVICE_UPLOAD_H_
