// Batches of device work over many separate pieces of device memory, run by
// one kernel launch each (issue #16's batched gather): a model's thousands of
// small tensors (biases, norms, optimizer scalars) cost one launch per save,
// not one copy or hash launch each. A batch's table of pieces is prepared once
// (Device::PrepareGather, Device::PrepareHashes: copied into device memory
// where the device has its own) and run at every save while the registered
// tensors stay the same.
//
// The tables are built here, on the host, the same way for every device, so
// the CPU twins run exactly the entries a GPU kernel runs.
#ifndef CKPT_KERNELS_BATCH_H_
#define CKPT_KERNELS_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ckpt::kernels {

// `n` bytes of device memory at `src`, gathered to `offset` bytes into the
// gather's destination.
struct GatherPiece {
  const void* src;
  uint64_t n;
  uint64_t offset;
};

// `n` bytes of device memory at `src`, hashed in chunks (Device::HashChunks).
struct HashRun {
  const void* src;
  uint64_t n;
};

// One unit of a batch kernel's work: `n` bytes at `src`; `at` is the
// destination offset (gather) or the index of the hash it yields (hashes).
struct TableEntry {
  const uint8_t* src;
  uint64_t n;
  uint64_t at;
};

// A gather's entries are at most this long, so that a launch's blocks share
// the work evenly whatever the tensors' sizes.
inline constexpr uint64_t kGatherEntryBytes = 64 << 10;

// The table of a gather: each piece split into entries of at most
// kGatherEntryBytes. An error names a piece whose destination overlaps
// another's.
absl::StatusOr<std::vector<TableEntry>> GatherTable(
    absl::Span<const GatherPiece> pieces);
// The table of a batch of chunk hashes: for every run, one entry per chunk
// of `chunk` bytes (the last one shorter), numbered in order.
absl::StatusOr<std::vector<TableEntry>> HashTable(
    absl::Span<const HashRun> runs, uint64_t chunk);

// A prepared batch. A device's batches are only run by that device, and a
// batch must outlive the work queued with it (Synchronize before destroying
// it).
class Batch {
 public:
  enum class Kind { kGather, kHashes };
  Batch(Kind kind, std::vector<TableEntry> entries);
  virtual ~Batch() = default;
  Kind kind() const { return kind_; }
  const std::vector<TableEntry>& entries() const { return entries_; }
  // kGather: the bytes its destination spans; kHashes: the hashes it yields.
  uint64_t outputs() const { return outputs_; }

 private:
  const Kind kind_;
  const std::vector<TableEntry> entries_;
  const uint64_t outputs_;
};

// Batches whose tables stay in host memory (the CPU devices).
absl::StatusOr<std::unique_ptr<Batch>> NewHostGather(
    absl::Span<const GatherPiece> pieces);
absl::StatusOr<std::unique_ptr<Batch>> NewHostHashes(
    absl::Span<const HashRun> runs, uint64_t chunk);

// The host's run of a batch (CpuDevice and its queued twin): a gather into
// host memory `dst`, and hashes into `hashes` with the GPU kernel's
// arithmetic (kernels/xxh3.h).
void RunGatherOnHost(const Batch& batch, void* dst);
void RunHashesOnHost(const Batch& batch, uint64_t* hashes);

// An error unless `batch` is of `kind` (what a device checks before running
// one).
absl::Status CheckBatch(const Batch& batch, Batch::Kind kind);

}  // namespace ckpt::kernels

#endif  // CKPT_KERNELS_BATCH_H_
