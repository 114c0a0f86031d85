// How libckpt's errors cross into Python: every absl::Status becomes an
// exception of ckpt.errors (python/ckpt/errors.py) here, keeping the
// daemon's message and its code's name.
//
// Thread-safety: call with the GIL held.
#ifndef CKPT_PYTHON_STATUS_ERRORS_H_
#define CKPT_PYTHON_STATUS_ERRORS_H_

#include <pybind11/pybind11.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckpt::python {

// The exception (not raised) that stands for a failed status.
pybind11::object ErrorFor(const absl::Status& status);

// Raises the exception of a failed status; nothing when it is OK.
void RaiseIfError(const absl::Status& status);

template <typename T>
T ValueOrRaise(absl::StatusOr<T> value) {
  RaiseIfError(value.status());
  return *std::move(value);
}

inline absl::Duration Seconds(double seconds) { return absl::Seconds(seconds); }

}  // namespace ckpt::python

#endif  // CKPT_PYTHON_STATUS_ERRORS_H_
