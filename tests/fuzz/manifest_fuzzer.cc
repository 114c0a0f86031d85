// Fuzzes the manifest and footer parsers: protobuf parsing of untrusted bytes
// and the structural validation that must reject every lying size or offset
// before anything is read.
#include <cstddef>
#include <cstdint>

#include "proto/manifest.pb.h"
#include "snapshot/format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt::snapshot;
  if (size >= kFooterSize)
    (void)DecodeFooter({data + size - kFooterSize, kFooterSize});
  ckpt::proto::ShardManifest manifest;
  if (manifest.ParseFromArray(data, static_cast<int>(size))) {
    (void)ValidateManifest(manifest, manifest.data_size());
    for (const auto& item : manifest.items()) (void)TensorByteSize(item);
  }
  return 0;
}
