#include "snapshot/dtype.h"

#include "absl/strings/str_cat.h"

namespace ckpt::snapshot {
namespace {

struct DTypeInfo {
  proto::DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {proto::DTYPE_BOOL, "bool", 1},
    {proto::DTYPE_UINT8, "uint8", 1},
    {proto::DTYPE_INT8, "int8", 1},
    {proto::DTYPE_UINT16, "uint16", 2},
    {proto::DTYPE_INT16, "int16", 2},
    {proto::DTYPE_UINT32, "uint32", 4},
    {proto::DTYPE_INT32, "int32", 4},
    {proto::DTYPE_UINT64, "uint64", 8},
    {proto::DTYPE_INT64, "int64", 8},
    {proto::DTYPE_FLOAT16, "float16", 2},
    {proto::DTYPE_BFLOAT16, "bfloat16", 2},
    {proto::DTYPE_FLOAT32, "float32", 4},
    {proto::DTYPE_FLOAT64, "float64", 8},
    {proto::DTYPE_FLOAT8_E4M3, "float8_e4m3", 1},
    {proto::DTYPE_FLOAT8_E5M2, "float8_e5m2", 1},
};

}  // namespace

size_t DTypeSize(proto::DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info.size;
  }
  return 0;
}

std::string DTypeName(proto::DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info.name;
  }
  return absl::StrCat("unknown(", static_cast<int>(dtype), ")");
}

absl::StatusOr<proto::DType> ParseDType(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\""));
}

std::vector<proto::DType> AllDTypes() {
  std::vector<proto::DType> out;
  for (const DTypeInfo& info : kDTypes) out.push_back(info.dtype);
  return out;
}

bool IsWideFloat(proto::DType dtype) {
  return dtype == proto::DTYPE_FLOAT16 || dtype == proto::DTYPE_BFLOAT16 ||
         dtype == proto::DTYPE_FLOAT32 || dtype == proto::DTYPE_FLOAT64;
}

}  // namespace ckpt::snapshot
