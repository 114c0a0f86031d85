#include "client/device_upload.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "io/logging.h"
#include "io/status_macros.h"

namespace ckpt::client {
namespace {

constexpr uint64_t kAlign = 4096;

// What one half of the buffer carries: whole tensors read together, or one
// range of a tensor larger than a half.
struct Unit {
  std::vector<size_t> tensors;  // whole ones, packed from the half's start
  size_t ranged = 0;            // else: this tensor's [offset, offset + n)
  uint64_t offset = 0, n = 0;
};

std::vector<Unit> Plan(const std::vector<UploadTensor>& tensors,
                       uint64_t half) {
  std::vector<Unit> units;
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
    const uint64_t at = (used + kAlign - 1) / kAlign * kAlign;
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

absl::Status UploadFromShard(kernels::Device* device,
                             snapshot::ShardReader& reader,
                             const std::vector<UploadTensor>& tensors,
                             uint64_t buffer_bytes) {
  uint64_t total = 0;  // as laid out in a half
  for (const UploadTensor& t : tensors) {
    total += (t.bytes + kAlign - 1) / kAlign * kAlign;
  }
  if (total == 0) return absl::OkStatus();
  // Two halves of the bound, or one that holds everything.
  const uint64_t half = std::max<uint64_t>(
      kAlign, std::min(buffer_bytes / 2 / kAlign * kAlign, total));
  const uint64_t bytes = 2 * half;
  std::unique_ptr<uint8_t, decltype(&std::free)> buffer(
      static_cast<uint8_t*>(std::aligned_alloc(kAlign, bytes)), &std::free);
  if (buffer == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("restoring to ", device->name(), ": no host buffer of ",
                     bytes, " bytes"));
  }
  absl::StatusOr<std::unique_ptr<kernels::HostRegistration>> pinned =
      device->RegisterHost(buffer.get(), bytes);
  if (!pinned.ok()) {
    CKPT_LOG_WARN(
        "restoring to {}: the host buffer is not pinned ({}); "
        "copies are slower",
        device->name(), pinned.status().ToString());
  }
  std::unique_ptr<kernels::Event> in_flight[2];
  absl::Status status;
  const std::vector<Unit> units = Plan(tensors, half);
  for (size_t k = 0; k < units.size() && status.ok(); ++k) {
    uint8_t* area = buffer.get() + (k % 2) * half;
    if (in_flight[k % 2] != nullptr) {
      // The copies out of this half are done before it is read into again.
      status = in_flight[k % 2]->Wait();
      in_flight[k % 2].reset();
      if (!status.ok()) break;
    }
    const Unit& unit = units[k];
    if (unit.tensors.empty()) {
      const UploadTensor& t = tensors[unit.ranged];
      status = reader.ReadItemRange(t.name, unit.offset,
                                    absl::MakeSpan(area, unit.n));
      if (status.ok()) {
        status = device->CopyFromHost(
            area, static_cast<uint8_t*>(t.dst) + unit.offset, unit.n);
      }
    } else {
      std::vector<snapshot::ShardReader::ItemRead> reads;
      std::vector<uint64_t> at;
      uint64_t used = 0;
      for (size_t i : unit.tensors) {
        used = (used + kAlign - 1) / kAlign * kAlign;
        at.push_back(used);
        reads.push_back(
            {tensors[i].name, absl::MakeSpan(area + used, tensors[i].bytes)});
        used += tensors[i].bytes;
      }
      status = reader.ReadItems(reads);
      for (size_t j = 0; status.ok() && j < unit.tensors.size(); ++j) {
        const UploadTensor& t = tensors[unit.tensors[j]];
        status = device->CopyFromHost(area + at[j], t.dst, t.bytes);
      }
    }
    if (status.ok()) {
      absl::StatusOr<std::unique_ptr<kernels::Event>> event =
          device->RecordEvent();
      if (event.ok()) {
        in_flight[k % 2] = *std::move(event);
      } else {
        status = event.status();
      }
    }
  }
  // Whatever was queued finishes before the buffer is freed.
  absl::Status synced = device->Synchronize();
  return status.ok() ? synced : status;
}

}  // namespace ckpt::client
