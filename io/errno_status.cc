#include "io/errno_status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ckpt::io {
namespace {

constexpr char kErrnoPayload[] = "type.ckpt/errno";

absl::StatusCode CodeForErrno(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::StatusCode::kNotFound;
    case EEXIST:
    case ENOTEMPTY:
      return absl::StatusCode::kAlreadyExists;
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EFBIG:
      return absl::StatusCode::kResourceExhausted;
    case EINVAL:
    case ENAMETOOLONG:
    case ELOOP:
    case EISDIR:
    case EBADF:
      return absl::StatusCode::kInvalidArgument;
    case EAGAIN:
    case EINTR:
    case EBUSY:
      return absl::StatusCode::kUnavailable;
    case ENOSYS:
    case EOPNOTSUPP:
      return absl::StatusCode::kUnimplemented;
    case EIO:
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status ErrnoToStatus(int err, absl::string_view context) {
  if (err == 0) return absl::OkStatus();
  absl::Status status(
      CodeForErrno(err),
      absl::StrCat(context, ": ", std::strerror(err), " (errno ", err, ")"));
  status.SetPayload(kErrnoPayload, absl::Cord(absl::StrCat(err)));
  return status;
}

std::optional<int> StatusErrno(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kErrnoPayload);
  if (!payload.has_value()) return std::nullopt;
  int err = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &err)) return std::nullopt;
  return err;
}

}  // namespace ckpt::io
