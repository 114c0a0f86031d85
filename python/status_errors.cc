#include "python/status_errors.h"

#include <string>

namespace py = pybind11;

namespace ckpt::python {
namespace {

// The ckpt.errors class for an absl status code.
const char* ErrorClassFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return "InvalidArgumentError";
    case absl::StatusCode::kNotFound:
      return "NotFoundError";
    case absl::StatusCode::kAlreadyExists:
      return "AlreadyExistsError";
    case absl::StatusCode::kFailedPrecondition:
      return "FailedPreconditionError";
    case absl::StatusCode::kUnavailable:
      return "UnavailableError";
    case absl::StatusCode::kDeadlineExceeded:
      return "DeadlineExceededError";
    case absl::StatusCode::kResourceExhausted:
      return "ResourceExhaustedError";
    case absl::StatusCode::kDataLoss:
      return "DataLossError";
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return "PermissionDeniedError";
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
      return "AbortedError";
    default:
      return "Error";
  }
}

}  // namespace

py::object ErrorFor(const absl::Status& status) {
  py::object cls =
      py::module_::import("ckpt.errors").attr(ErrorClassFor(status.code()));
  return cls(std::string(status.message()),
             std::string(absl::StatusCodeToString(status.code())));
}

void RaiseIfError(const absl::Status& status) {
  if (status.ok()) return;
  py::object error = ErrorFor(status);
  PyErr_SetObject(error.get_type().ptr(), error.ptr());
  throw py::error_already_set();
}

}  // namespace ckpt::python
