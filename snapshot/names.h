// Validation of names that come from users before any of them reaches the file
// system or a manifest: job ids, item (tensor and byte item) names, and
// relative paths.
//
// Thread-safety: pure functions, callable from any thread.
#ifndef CKPT_SNAPSHOT_NAMES_H_
#define CKPT_SNAPSHOT_NAMES_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt::snapshot {

inline constexpr size_t kMaxJobIdLength = 128;
inline constexpr size_t kMaxItemNameLength = 1024;
inline constexpr size_t kMaxPathLength = 4096;

// A job id becomes a directory name: [A-Za-z0-9._-], 1..128 bytes, not "." or
// "..".
absl::Status ValidateJobId(absl::string_view job);
// A topic a step is published under: the same rules as a job id.
absl::Status ValidateTopic(absl::string_view topic);
// A tensor or byte item name: 1..1024 printable ASCII bytes; '/' separates
// components, none of which may be empty, "." or ".."; no leading '/'.
absl::Status ValidateItemName(absl::string_view name);
// A path below a root the caller owns: relative, no NUL, no "." or ".."
// component.
absl::Status ValidateRelativePath(absl::string_view path);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_NAMES_H_
