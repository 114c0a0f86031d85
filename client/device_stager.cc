#include "client/device_stager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/chunk_codec.h"

namespace ckpt::client {
namespace {

// Gathered tensors further apart than this in the slot (more than alignment
// padding) start a new batch: a batch's copy overwrites what lies between
// its tensors.
constexpr uint64_t kMaxGap = 4096;

}  // namespace

DeviceStager::DeviceStager(kernels::Device* device, Options options)
    : device_(device), options_(options) {}

DeviceStager::~DeviceStager() {
  (void)device_->Synchronize();
  DropGathers();
}

bool DeviceStager::Gathers(uint64_t bytes) const {
  return bytes > 0 && bytes <= options_.gather_max_bytes &&
         options_.gather_max_bytes <= options_.gather_buffer_bytes;
}

void DeviceStager::DropGathers() {
  batches_.clear();
  if (buffer_ != nullptr) device_->Free(buffer_);
  buffer_ = nullptr;
}

void DeviceStager::PrepareGathers(const std::vector<Tensor>& gathered) {
  (void)device_->Synchronize();  // no queued work uses the old batches
  DropGathers();
  gathered_ = gathered;
  gather_refused_.clear();
  if (gathered.empty()) return;
  std::vector<std::pair<size_t, size_t>> runs;  // [first, last) of gathered
  uint64_t widest = 0;
  for (size_t i = 0; i < gathered.size(); ++i) {
    const Tensor& t = gathered[i];
    if (runs.empty() ||
        t.slot_offset >
            gathered[i - 1].slot_offset + gathered[i - 1].bytes + kMaxGap ||
        t.slot_offset + t.bytes - gathered[runs.back().first].slot_offset >
            options_.gather_buffer_bytes) {
      runs.emplace_back(i, i);
    }
    runs.back().second = i + 1;
    widest = std::max(widest, t.slot_offset + t.bytes -
                                  gathered[runs.back().first].slot_offset);
  }
  absl::StatusOr<void*> buffer = device_->Allocate(widest);
  if (!buffer.ok()) {
    gather_refused_ = absl::StrCat("no device buffer of ", widest,
                                   " bytes to gather ", gathered.size(),
                                   " tensors in: ", buffer.status().message());
    CKPT_LOG_WARN("{}; copying each tensor instead", gather_refused_);
    return;
  }
  buffer_ = *buffer;
  for (const auto& [first, last] : runs) {
    const uint64_t begin = gathered[first].slot_offset;
    std::vector<kernels::GatherPiece> pieces;
    for (size_t i = first; i < last; ++i) {
      pieces.push_back({gathered[i].data, gathered[i].bytes,
                        gathered[i].slot_offset - begin});
    }
    absl::StatusOr<std::unique_ptr<kernels::Batch>> batch =
        device_->PrepareGather(pieces);
    if (!batch.ok()) {
      gather_refused_ = absl::StrCat("preparing a gather of ", pieces.size(),
                                     " tensors: ", batch.status().message());
      CKPT_LOG_WARN("{}; copying each tensor instead", gather_refused_);
      DropGathers();
      return;
    }
    batches_.push_back(
        {*std::move(batch), begin,
         gathered[last - 1].slot_offset + gathered[last - 1].bytes,
         last - first});
  }
}

absl::Status DeviceStager::QueueCopies(const std::vector<Tensor>& tensors,
                                       uint8_t* slot) {
  std::vector<Tensor> gathered;
  for (const Tensor& t : tensors) {
    if (Gathers(t.bytes)) gathered.push_back(t);
  }
  std::sort(gathered.begin(), gathered.end(),
            [](const Tensor& a, const Tensor& b) {
              return a.slot_offset < b.slot_offset;
            });
  if (gathered != gathered_) PrepareGathers(gathered);
  const bool gathering = !batches_.empty();
  stats_.gather_refused = gathering ? "" : gather_refused_;
  for (const GatherBatch& b : batches_) {
    // The batch waits for the previous one's copy out of the buffer: both are
    // on the device's one stream.
    RETURN_IF_ERROR(device_->Gather(*b.gather, buffer_));
    RETURN_IF_ERROR(
        device_->CopyToHost(buffer_, slot + b.begin, b.end - b.begin));
    stats_.tensors_gathered += b.tensors;
    ++stats_.gather_launches;
    CKPT_KILL_POINT("client.item_copied");
  }
  for (const Tensor& t : tensors) {
    if (t.bytes == 0 || (gathering && Gathers(t.bytes))) continue;
    RETURN_IF_ERROR(device_->CopyToHost(t.data, slot + t.slot_offset, t.bytes));
    ++stats_.tensors_copied;
    CKPT_KILL_POINT("client.item_copied");
  }
  return absl::OkStatus();
}

absl::Status DeviceStager::QueueHashes(const std::vector<Tensor>& tensors,
                                       uint32_t chunk,
                                       std::vector<uint64_t>* first) {
  if (hash_batch_ == nullptr || chunk != hashed_chunk_ || tensors != hashed_) {
    (void)device_->Synchronize();  // no queued work uses the old batch
    hash_batch_.reset();
    hashed_ = tensors;
    hashed_chunk_ = chunk;
    hash_first_.clear();
    std::vector<kernels::HashRun> runs;
    uint64_t next = 0;
    for (const Tensor& t : tensors) {
      hash_first_.push_back(next);
      runs.push_back({t.data, t.bytes});
      next += snapshot::ChunkCount(t.bytes, chunk);
    }
    if (hashes_.size() < next) {
      hashes_pinned_.reset();
      hashes_.assign(next, 0);
      absl::StatusOr<std::unique_ptr<kernels::HostRegistration>> pinned =
          device_->RegisterHost(hashes_.data(), next * sizeof(uint64_t));
      if (!pinned.ok()) {
        hashes_.clear();
        return pinned.status();
      }
      hashes_pinned_ = *std::move(pinned);
    }
    ASSIGN_OR_RETURN(hash_batch_, device_->PrepareHashes(runs, chunk));
  }
  RETURN_IF_ERROR(device_->HashBatch(*hash_batch_, hashes_.data()));
  *first = hash_first_;
  return absl::OkStatus();
}

}  // namespace ckpt::client
