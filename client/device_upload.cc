#include "client/device_upload.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/parallel_copy.h"
#include "io/logging.h"
#include "io/status_macros.h"

namespace ckpt::client {
namespace {

constexpr uint64_t kAlign = 4096;

uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// What one half of the buffer carries from a shard file: whole tensors read
// together, or one range of a tensor larger than a half.
struct ShardUnit {
  std::vector<size_t> tensors;  // whole ones, packed from the half's start
  size_t ranged = 0;            // else: this tensor's [offset, offset + n)
  uint64_t offset = 0, n = 0;
};

std::vector<ShardUnit> PlanShard(const std::vector<UploadTensor>& tensors,
                                 uint64_t half) {
  std::vector<ShardUnit> units;
  uint64_t used = half;  // of the last whole-tensor unit
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t n = tensors[i].bytes;
    if (n == 0) continue;
    if (n > half) {
      for (uint64_t at = 0; at < n; at += half) {
        units.push_back({{}, i, at, std::min(half, n - at)});
      }
      used = half;
      continue;
    }
    const uint64_t at = AlignUp(used);
    if (units.empty() || units.back().tensors.empty() || at + n > half) {
      units.push_back({});
      used = 0;
    } else {
      used = at;
    }
    units.back().tensors.push_back(i);
    used += n;
  }
  return units;
}

}  // namespace

PinnedHalves::PinnedHalves(kernels::Device* device, uint64_t half)
    : device_(device),
      half_(AlignUp(half)),
      buffer_(static_cast<uint8_t*>(std::aligned_alloc(kAlign, 2 * half_)),
              &std::free) {}

PinnedHalves::~PinnedHalves() { (void)device_->Synchronize(); }

absl::Status PinnedHalves::Pin() {
  if (buffer_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("restoring to ", device_->name(), ": no host buffer of ",
                     2 * half_, " bytes"));
  }
  absl::StatusOr<std::unique_ptr<kernels::HostRegistration>> pinned =
      device_->RegisterHost(buffer_.get(), 2 * half_);
  if (pinned.ok()) {
    pinned_ = *std::move(pinned);
  } else {
    CKPT_LOG_WARN(
        "restoring to {}: the host buffer is not pinned ({}); "
        "copies are slower",
        device_->name(), pinned.status().ToString());
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> PinnedHalves::Fill(size_t k) {
  std::unique_ptr<kernels::Event>& sent = sent_[k % 2];
  if (sent != nullptr) {
    absl::Status s = sent->Wait();
    sent.reset();
    if (!s.ok()) return s;
  }
  return buffer_.get() + (k % 2) * half_;
}

absl::Status PinnedHalves::Send(size_t k) {
  ASSIGN_OR_RETURN(sent_[k % 2], device_->RecordEvent());
  return absl::OkStatus();
}

absl::Status PinnedHalves::Finish() { return device_->Synchronize(); }

absl::Status UploadFromShard(kernels::Device* device,
                             snapshot::ShardReader& reader,
                             const std::vector<UploadTensor>& tensors,
                             uint64_t buffer_bytes) {
  uint64_t total = 0;  // as laid out in a half
  for (const UploadTensor& t : tensors) total += AlignUp(t.bytes);
  if (total == 0) return absl::OkStatus();
  // Two halves of the bound, or one that holds everything.
  const uint64_t half =
      std::max(kAlign, std::min(buffer_bytes / 2 / kAlign * kAlign, total));
  PinnedHalves halves(device, half);
  RETURN_IF_ERROR(halves.Pin());
  const std::vector<ShardUnit> units = PlanShard(tensors, half);
  for (size_t k = 0; k < units.size(); ++k) {
    ASSIGN_OR_RETURN(uint8_t * area, halves.Fill(k));
    const ShardUnit& unit = units[k];
    if (unit.tensors.empty()) {
      const UploadTensor& t = tensors[unit.ranged];
      RETURN_IF_ERROR(reader.ReadItemRange(t.name, unit.offset,
                                           absl::MakeSpan(area, unit.n)));
      RETURN_IF_ERROR(device->CopyFromHost(
          area, static_cast<uint8_t*>(t.dst) + unit.offset, unit.n));
    } else {
      std::vector<snapshot::ShardReader::ItemRead> reads;
      std::vector<uint64_t> at;
      uint64_t used = 0;
      for (size_t i : unit.tensors) {
        used = AlignUp(used);
        at.push_back(used);
        reads.push_back(
            {tensors[i].name, absl::MakeSpan(area + used, tensors[i].bytes)});
        used += tensors[i].bytes;
      }
      RETURN_IF_ERROR(reader.ReadItems(reads));
      for (size_t j = 0; j < unit.tensors.size(); ++j) {
        const UploadTensor& t = tensors[unit.tensors[j]];
        RETURN_IF_ERROR(device->CopyFromHost(area + at[j], t.dst, t.bytes));
      }
    }
    RETURN_IF_ERROR(halves.Send(k));
  }
  return halves.Finish();
}

absl::Status UploadFromHost(kernels::Device* device,
                            const std::vector<HostRun>& runs,
                            const CheckLanded& check, uint64_t buffer_bytes) {
  uint64_t total = 0, largest = 0;
  for (const HostRun& r : runs) {
    total += AlignUp(r.bytes);
    largest = std::max(largest, AlignUp(r.bytes));
  }
  if (total == 0) return absl::OkStatus();
  const uint64_t half = std::max(
      {kAlign, largest, std::min(buffer_bytes / 2 / kAlign * kAlign, total)});
  PinnedHalves halves(device, half);
  RETURN_IF_ERROR(halves.Pin());
  // Consecutive runs that fill a half: [first, last).
  std::vector<std::pair<size_t, size_t>> groups;
  uint64_t used = half;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].bytes == 0) continue;
    if (groups.empty() || used + AlignUp(runs[i].bytes) > half) {
      groups.emplace_back(i, i);
      used = 0;
    }
    groups.back().second = i + 1;
    used += AlignUp(runs[i].bytes);
  }
  for (size_t k = 0; k < groups.size(); ++k) {
    ASSIGN_OR_RETURN(uint8_t * area, halves.Fill(k));
    const auto [first, last] = groups[k];
    std::vector<uint64_t> at(last - first);
    uint64_t bytes = 0;
    for (size_t i = first; i < last; ++i) {
      at[i - first] = bytes;
      bytes += AlignUp(runs[i].bytes);
    }
    std::vector<absl::Status> checked(last - first);
    ParallelFor(last - first, CopyThreadsFor(bytes), [&](size_t j) {
      const HostRun& run = runs[first + j];
      if (run.bytes == 0) return;
      std::copy_n(run.src, run.bytes, area + at[j]);
      if (check) {
        checked[j] =
            check(first + j, absl::MakeConstSpan(area + at[j], run.bytes));
      }
    });
    for (const absl::Status& s : checked) RETURN_IF_ERROR(s);
    for (size_t i = first; i < last; ++i) {
      if (runs[i].bytes == 0) continue;
      RETURN_IF_ERROR(device->CopyFromHost(area + at[i - first], runs[i].dst,
                                           runs[i].bytes));
    }
    RETURN_IF_ERROR(halves.Send(k));
  }
  return halves.Finish();
}

}  // namespace ckpt::client
