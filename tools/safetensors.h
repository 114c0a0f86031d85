// Writes the safetensors format (huggingface/safetensors): an 8-byte
// little-endian header length, a JSON header mapping each tensor name to its
// dtype, shape and [begin, end) data offsets (plus an optional "__metadata__"
// map of strings), padded with spaces to a multiple of 8 bytes, then the raw
// little-endian tensor bytes. Tensors are added one at a time and written as
// they come, so a checkpoint larger than memory can be exported one tensor at
// a time. The file is written to a temporary name, synced and renamed.
//
// Thread-safety: one thread at a time.
#ifndef CKPT_TOOLS_SAFETENSORS_H_
#define CKPT_TOOLS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "io/aligned_buffer.h"
#include "io/file_system.h"
#include "proto/manifest.pb.h"

namespace ckpt::tools {

// "F32", "BF16", ...; InvalidArgument for a dtype safetensors cannot name.
absl::StatusOr<std::string> SafetensorsDType(proto::DType dtype);

struct SafetensorsEntry {
  std::string name;
  proto::DType dtype;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

class SafetensorsWriter {
 public:
  // Every tensor must be declared up front: the header comes first.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      io::FileSystem* fs, const std::string& path,
      const std::vector<SafetensorsEntry>& entries,
      const std::map<std::string, std::string>& metadata);
  // The data of the next declared tensor, in declaration order.
  absl::Status Append(io::AlignedBuffer data);
  // Syncs and renames into place once every tensor was appended.
  absl::Status Commit();

 private:
  SafetensorsWriter(io::FileSystem* fs, std::string path,
                    std::vector<SafetensorsEntry> entries)
      : fs_(fs), path_(std::move(path)), entries_(std::move(entries)) {}

  io::FileSystem* const fs_;
  const std::string path_;
  const std::vector<SafetensorsEntry> entries_;
  std::unique_ptr<io::WritableFile> file_;
  size_t next_ = 0;
  uint64_t offset_ = 0;  // where the next tensor's bytes go in the file
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_SAFETENSORS_H_
