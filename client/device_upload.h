// DeviceUpload restores tensors in device memory from a shard file (issue
// #16's restore to device): the file's items are read and decoded into a
// pinned host buffer, half of it at a time, and each half is copied to the
// device on its stream while the other half is read, so the disk and the
// host-to-device link work at once. Tensors that fit a half are read
// together (one ShardReader pass keeps the disk busy across small items);
// larger ones in ranges of a half.
//
// The buffer is allocated and pinned for one restore and released after it:
// restores are rare, and pinned memory kept for the whole run would be taken
// from the trainer.
#ifndef CKPT_CLIENT_DEVICE_UPLOAD_H_
#define CKPT_CLIENT_DEVICE_UPLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {

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

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_DEVICE_UPLOAD_H_
