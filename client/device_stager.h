// DeviceStager queues a save's copies of device tensors into the staging slot,
// and their chunk hashes, on the device's stream (issue #16):
//   - tensors of at most `gather_max_bytes` are gathered by one kernel launch
//     per batch into a device buffer of at most `gather_buffer_bytes`, and
//     each batch reaches the slot by one D2H copy, so a model's thousands of
//     biases, norms and optimizer scalars cost a few launches, not one copy
//     each;
//   - larger tensors go by a D2H copy each;
//   - every tensor's chunk hashes come from one launch, into pinned host
//     memory.
// The batches' device-side tables are prepared at the first save and kept
// while the tensors stay the same. When the device has no memory for the
// buffer, the save copies each tensor instead and says why in stats().
//
// Thread-safety: used by the thread driving saves only.
#ifndef CKPT_CLIENT_DEVICE_STAGER_H_
#define CKPT_CLIENT_DEVICE_STAGER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/device.h"

namespace ckpt::client {

class DeviceStager {
 public:
  struct Options {
    // Tensors of at most this many bytes are gathered; 0: none is.
    uint64_t gather_max_bytes = 1 << 20;
    // The device buffer batches are gathered into: at most this many bytes
    // (at least gather_max_bytes, or nothing is gathered).
    uint64_t gather_buffer_bytes = 64 << 20;
  };
  // A registered tensor: `bytes` of device memory at `data`, staged at
  // `slot_offset`.
  struct Tensor {
    const void* data;
    uint64_t bytes;
    uint64_t slot_offset;
    bool operator==(const Tensor& o) const {
      return data == o.data && bytes == o.bytes && slot_offset == o.slot_offset;
    }
  };
  struct Stats {
    uint64_t tensors_gathered = 0;  // tensors copied by gather launches
    uint64_t gather_launches = 0;   // gather launches (one D2H copy each)
    uint64_t tensors_copied = 0;    // tensors copied by a D2H copy of their own
    // Why the latest save did not gather (empty when it did, or had nothing
    // to gather).
    std::string gather_refused;
  };

  DeviceStager(kernels::Device* device, Options options);
  // Waits for the device's queued work, then frees the buffer and tables.
  ~DeviceStager();

  // Whether a tensor of `bytes` is gathered. The slot layout places gathered
  // tensors one after the other: the bytes between two of them (alignment
  // padding) are overwritten by the batch's copy.
  bool Gathers(uint64_t bytes) const;
  // Queues the copies of `tensors` into the slot mapped at `slot` (registered
  // with the device).
  absl::Status QueueCopies(const std::vector<Tensor>& tensors, uint8_t* slot);
  // Queues the XXH3-64 of every `chunk`-byte run of every tensor (one launch);
  // (*first)[i] is the index of tensor i's first hash in hashes(), complete
  // once the device's work queued so far is.
  absl::Status QueueHashes(const std::vector<Tensor>& tensors, uint32_t chunk,
                           std::vector<uint64_t>* first);
  const uint64_t* hashes() const { return hashes_.data(); }
  const Stats& stats() const { return stats_; }

 private:
  // A run of gathered tensors that one launch and one copy bring to the slot:
  // [begin, end) of the slot, from the buffer's start.
  struct GatherBatch {
    std::unique_ptr<kernels::Batch> gather;
    uint64_t begin, end;
    size_t tensors;
  };
  // Prepares batches_ for `gathered` (by slot offset) and the buffer, or
  // says in gather_refused_ why not.
  void PrepareGathers(const std::vector<Tensor>& gathered);
  void DropGathers();

  kernels::Device* const device_;
  const Options options_;
  // The gathered tensors batches_ were made for.
  std::vector<Tensor> gathered_;
  std::vector<GatherBatch> batches_;
  void* buffer_ = nullptr;
  std::string gather_refused_;  // why batches_ is empty
  // The hash batch and what it was made for.
  std::vector<Tensor> hashed_;
  uint32_t hashed_chunk_ = 0;
  std::unique_ptr<kernels::Batch> hash_batch_;
  std::vector<uint64_t> hash_first_;
  std::vector<uint64_t> hashes_;  // pinned: the device writes them
  std::unique_ptr<kernels::HostRegistration> hashes_pinned_;
  Stats stats_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_DEVICE_STAGER_H_
