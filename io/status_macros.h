// The project's two status macros. Debian's Abseil (20220623) ships none, so
// they are defined here once and used everywhere.
//
// Thread-safety: macros over the caller's own values.
#ifndef CKPT_IO_STATUS_MACROS_H_
#define CKPT_IO_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CKPT_STATUS_CONCAT_INNER_(a, b) a##b
#define CKPT_STATUS_CONCAT_(a, b) CKPT_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status _ckpt_status = (expr);        \
    if (!_ckpt_status.ok()) return _ckpt_status; \
  } while (0)

// `lhs` = the value of `expr` (an absl::StatusOr<T>), or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr)                                           \
  CKPT_ASSIGN_OR_RETURN_IMPL_(CKPT_STATUS_CONCAT_(_ckpt_statusor_, __LINE__), \
                              lhs, expr)
#define CKPT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

#endif  // CKPT_IO_STATUS_MACROS_H_
