// Converts errno values (from system calls and from io_uring completions, whose
// negative `res` is an errno) to absl::Status. This is the only place where the
// errno space is converted; the errno is kept as a payload so callers can tell
// ENOSPC from EIO without parsing messages.
//
// Thread-safety: pure functions, callable from any thread.
#ifndef CKPT_IO_ERRNO_STATUS_H_
#define CKPT_IO_ERRNO_STATUS_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt::io {

// `context` names the operation and the file, e.g. "write /data/x.shard at
// offset 4096".
absl::Status ErrnoToStatus(int err, absl::string_view context);

// The errno recorded by ErrnoToStatus, if the status came from there.
std::optional<int> StatusErrno(const absl::Status& status);

}  // namespace ckpt::io

#endif  // CKPT_IO_ERRNO_STATUS_H_
