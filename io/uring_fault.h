// Fault hooks for the io_uring engine: tests use them to turn a submission into
// a short one or to make it complete with an errno, without touching the
// kernel.
//
// Thread-safety: install a hook before the engine runs; it is then called on
// the engine's submitting thread.
#ifndef CKPT_IO_URING_FAULT_H_
#define CKPT_IO_URING_FAULT_H_

#include <cstddef>
#include <cstdint>
#include <functional>

namespace ckpt::io {

// What a fault hook wants done to one submission.
struct UringFault {
  enum Kind { kNone, kShort, kErrno };
  Kind kind = kNone;
  size_t short_length = 0;  // kShort: submit only this many bytes (the engine
                            // sends the rest later)
  int err =
      0;  // kErrno: the request completes with -err without reaching the disk
};

struct UringRequestInfo {
  bool is_write;
  uint64_t offset;
  size_t length;
};

using UringFaultHook = std::function<UringFault(const UringRequestInfo&)>;

}  // namespace ckpt::io

#endif  // CKPT_IO_URING_FAULT_H_
