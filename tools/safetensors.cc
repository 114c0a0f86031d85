#include "tools/safetensors.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "io/status_macros.h"
#include "nlohmann/json.hpp"
#include "snapshot/dtype.h"

namespace ckpt::tools {

absl::StatusOr<std::string> SafetensorsDType(proto::DType dtype) {
  switch (dtype) {
    case proto::DTYPE_BOOL:
      return "BOOL";
    case proto::DTYPE_UINT8:
      return "U8";
    case proto::DTYPE_INT8:
      return "I8";
    case proto::DTYPE_UINT16:
      return "U16";
    case proto::DTYPE_INT16:
      return "I16";
    case proto::DTYPE_UINT32:
      return "U32";
    case proto::DTYPE_INT32:
      return "I32";
    case proto::DTYPE_UINT64:
      return "U64";
    case proto::DTYPE_INT64:
      return "I64";
    case proto::DTYPE_FLOAT16:
      return "F16";
    case proto::DTYPE_BFLOAT16:
      return "BF16";
    case proto::DTYPE_FLOAT32:
      return "F32";
    case proto::DTYPE_FLOAT64:
      return "F64";
    case proto::DTYPE_FLOAT8_E4M3:
      return "F8_E4M3";
    case proto::DTYPE_FLOAT8_E5M2:
      return "F8_E5M2";
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors has no dtype for ", snapshot::DTypeName(dtype)));
  }
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    io::FileSystem* fs, const std::string& path,
    const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    if (e.name == "__metadata__" || header.contains(e.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name \"", e.name, "\" is taken"));
    }
    ASSIGN_OR_RETURN(std::string dtype, SafetensorsDType(e.dtype));
    header[e.name] = {{"dtype", dtype},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // data starts 8-aligned
  std::unique_ptr<SafetensorsWriter> w(
      new SafetensorsWriter(fs, path, entries));
  ASSIGN_OR_RETURN(w->file_,
                   fs->NewWritableFile(absl::StrCat(path, ".tmp"),
                                       io::FileOptions{.direct = false}));
  io::AlignedBuffer head(8 + json.size());
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i)
    head.data()[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(head.data() + 8, json.data(), json.size());
  RETURN_IF_ERROR(w->file_->Write(0, std::move(head)));
  w->offset_ = 8 + n;
  return w;
}

absl::Status SafetensorsWriter::Append(io::AlignedBuffer data) {
  if (next_ >= entries_.size()) {
    return absl::FailedPreconditionError("every declared tensor was written");
  }
  const SafetensorsEntry& e = entries_[next_++];
  if (data.size() != e.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", e.name, "\" declared ", e.bytes,
                     " bytes, got ", data.size()));
  }
  if (e.bytes > 0) RETURN_IF_ERROR(file_->Write(offset_, std::move(data)));
  offset_ += e.bytes;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Commit() {
  if (next_ != entries_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(entries_.size() - next_, " declared tensors not written"));
  }
  RETURN_IF_ERROR(file_->Sync());
  RETURN_IF_ERROR(file_->Close());
  RETURN_IF_ERROR(fs_->Rename(absl::StrCat(path_, ".tmp"), path_));
  return fs_->SyncDir(io::DirName(path_));
}

}  // namespace ckpt::tools
