// UringEngine keeps a bounded number of positional reads and writes on file
// descriptors in flight through one io_uring. It hides what io_uring leaves to
// the caller: short completions are resubmitted for the remainder, -EAGAIN and
// -EINTR are resubmitted whole, every completion is matched to its request, and
// Drain() waits for everything still in flight (the destructor drains too, so
// no buffer is released while the kernel may still use it).
//
// A fault hook lets tests turn a request into a short one or make it complete
// with an errno, to prove the resubmission logic produces byte-exact files.
//
// Thread-safety: not thread-safe; one owner (a file) drives it.
#ifndef CKPT_IO_URING_ENGINE_H_
#define CKPT_IO_URING_ENGINE_H_

#include <liburing.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "io/uring_fault.h"

namespace ckpt::io {

struct UringEngineOptions {
  unsigned queue_depth = 16;
  UringFaultHook fault_hook;  // tests only
};

class UringEngine {
 public:
  // Called once per request when it completed fully or failed (not for
  // resubmissions).
  using Callback = std::function<void(absl::Status)>;

  static absl::StatusOr<std::unique_ptr<UringEngine>> Create(
      const UringEngineOptions& options);
  ~UringEngine();
  UringEngine(const UringEngine&) = delete;
  UringEngine& operator=(const UringEngine&) = delete;

  // Queues a request; blocks reaping completions while queue_depth requests are
  // in flight. `path` names the file in error messages. `buf` must stay valid
  // until `done` runs.
  absl::Status SubmitWrite(int fd, const std::string* path, const uint8_t* buf,
                           size_t length, uint64_t offset, Callback done);
  absl::Status SubmitRead(int fd, const std::string* path, uint8_t* buf,
                          size_t length, uint64_t offset, Callback done);
  // Waits until nothing is in flight.
  absl::Status Drain();
  // Waits until at least one request completed (its callback ran), or nothing
  // is in flight.
  absl::Status WaitAny();
  // Runs the callbacks of requests that completed, without waiting.
  absl::Status Poll();
  size_t in_flight() const { return in_flight_; }

 private:
  struct Request;
  explicit UringEngine(const UringEngineOptions& options);
  absl::Status Submit(std::unique_ptr<Request> request);
  absl::Status Push(Request* request);
  absl::Status ReapOne();
  // Handles one completion queue entry (already taken from the ring).
  absl::Status Handle(Request* request, int res);
  void Complete(Request* request, absl::Status status);

  UringEngineOptions options_;
  io_uring ring_;
  bool ring_ready_ = false;
  size_t in_flight_ = 0;
  uint64_t completed_ = 0;
  // Requests waiting for a free submission slot after a short completion or
  // EAGAIN.
  std::vector<Request*> retry_;
};

}  // namespace ckpt::io

#endif  // CKPT_IO_URING_ENGINE_H_
