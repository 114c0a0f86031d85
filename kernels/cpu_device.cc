#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/device.h"
#include "snapshot/filter.h"

namespace ckpt::kernels {
namespace {

// Copies are done when CopyToHost returns, so an event is always complete.
class DoneEvent final : public Event {
 public:
  absl::Status Wait() override { return absl::OkStatus(); }
};

class CpuDevice final : public Device {
 public:
  std::string name() const override { return "cpu"; }
  absl::Status CopyToHost(const void* src, void* dst, size_t n) override {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(const void* src, void* dst, size_t n) override {
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  absl::Status ByteShuffle(const void* src, void* dst, size_t n,
                           size_t width) override {
    snapshot::ByteShuffle(static_cast<const uint8_t*>(src),
                          static_cast<uint8_t*>(dst), n, width);
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
