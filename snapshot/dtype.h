// Element types of tensors: their width in bytes and their names.
//
// Thread-safety: pure functions and constants, callable from any thread.
#ifndef CKPT_SNAPSHOT_DTYPE_H_
#define CKPT_SNAPSHOT_DTYPE_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/manifest.pb.h"

namespace ckpt::snapshot {

// Width of one element in bytes; 0 for DTYPE_UNSPECIFIED and unknown values.
size_t DTypeSize(proto::DType dtype);
// "float32", "bfloat16", ...; "unknown(N)" for values not in the enum.
std::string DTypeName(proto::DType dtype);
absl::StatusOr<proto::DType> ParseDType(absl::string_view name);
// Floating point of 2 bytes or more (float16, bfloat16, float32, float64):
// what may be stored as an XOR delta.
bool IsWideFloat(proto::DType dtype);
// Every dtype a tensor may have (all but DTYPE_UNSPECIFIED).
std::vector<proto::DType> AllDTypes();

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_DTYPE_H_
