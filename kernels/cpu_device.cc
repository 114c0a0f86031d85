#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/parallel.h"
#include "kernels/device.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/filter.h"

namespace ckpt::kernels {
namespace {

// A copy of at least two parts of this size is split over up to
// kMaxCopyThreads threads: one core's memcpy does not saturate the memory bus
// (768 MiB into a tmpfs mapping: 10 GB/s with one thread, 15-20 GB/s with two
// on the 2-core development machine).
constexpr size_t kMinCopyPart = 4 << 20;
constexpr size_t kMaxCopyThreads = 4;

void ParallelCopy(void* dst, const void* src, size_t n) {
  const size_t parts = std::min<size_t>(
      {kMaxCopyThreads, std::max(1u, std::thread::hardware_concurrency()),
       n / kMinCopyPart});
  if (parts <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  const size_t per = (n / parts + 63) / 64 * 64;
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  io::ParallelFor((n + per - 1) / per, static_cast<int>(parts), [=](size_t i) {
    const size_t at = i * per;
    std::memcpy(d + at, s + at, std::min(per, n - at));
  });
}

// Copies are done when CopyToHost returns, so an event is always complete.
class DoneEvent final : public Event {
 public:
  absl::Status Wait() override { return absl::OkStatus(); }
};

class CpuDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }
  absl::Status CopyToHost(const void* src, void* dst, size_t n) override {
    ParallelCopy(dst, src, n);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(const void* src, void* dst, size_t n) override {
    ParallelCopy(dst, src, n);
    return absl::OkStatus();
  }
  absl::Status ByteShuffle(const void* src, void* dst, size_t n,
                           size_t width) override {
    snapshot::ByteShuffle(static_cast<const uint8_t*>(src),
                          static_cast<uint8_t*>(dst), n, width);
    return absl::OkStatus();
  }
  absl::Status HashChunks(const void* src, size_t n, size_t chunk,
                          uint64_t* hashes) override {
    if (chunk == 0) return absl::InvalidArgumentError("HashChunks: chunk 0");
    const auto* p = static_cast<const uint8_t*>(src);
    for (size_t at = 0, i = 0; at < n; at += chunk, ++i) {
      hashes[i] = snapshot::Checksum({p + at, std::min(chunk, n - at)});
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Batch>> PrepareGather(
      absl::Span<const GatherPiece> pieces) override {
    return NewHostGather(pieces);
  }
  absl::Status Gather(const Batch& gather, void* dst) override {
    absl::Status s = CheckBatch(gather, Batch::Kind::kGather);
    if (s.ok()) RunGatherOnHost(gather, dst);
    return s;
  }
  absl::StatusOr<std::unique_ptr<Batch>> PrepareHashes(
      absl::Span<const HashRun> runs, size_t chunk) override {
    return NewHostHashes(runs, chunk);
  }
  // libxxhash's, the reference.
  absl::Status HashBatch(const Batch& batch, uint64_t* hashes) override {
    absl::Status s = CheckBatch(batch, Batch::Kind::kHashes);
    if (!s.ok()) return s;
    for (const TableEntry& e : batch.entries()) {
      hashes[e.at] = snapshot::Checksum({e.src, e.n});
    }
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  bool host_resident() const override { return true; }
  bool queues_copies() const override { return false; }
  absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHost(
      void*, size_t) override {
    return std::make_unique<HostRegistration>();
  }
  absl::StatusOr<std::unique_ptr<Event>> RecordEvent() override {
    return std::make_unique<DoneEvent>();
  }
  absl::Status WaitForStream(void*) override { return absl::OkStatus(); }
  absl::Status StreamWaitEvent(void*, Event&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Allocate(size_t n) override {
    void* p = std::malloc(n == 0 ? 1 : n);
    if (p == nullptr)
      return absl::ResourceExhaustedError(
          absl::StrCat("malloc of ", n, " bytes"));
    return p;
  }
  void Free(void* p) override { std::free(p); }
};

}  // namespace

std::unique_ptr<Device> NewCpuDevice() { return std::make_unique<CpuDevice>(); }

}  // namespace ckpt::kernels
