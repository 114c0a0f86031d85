// Fuzzes the chunk header parser and the chunk decoder. The stored checksum is
// recomputed from the input so the fuzzer reaches zstd and the filter instead
// of stopping at the checksum; the decoder must bound every decompression by
// the declared raw size.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "snapshot/chunk_codec.h"
#include "snapshot/format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt::snapshot;
  if (size < kChunkHeaderSize) return 0;
  absl::StatusOr<ChunkHeader> parsed =
      DecodeChunkHeader({data, kChunkHeaderSize});
  ChunkHeader header;
  if (parsed.ok()) {
    header = *parsed;
  } else {
    // Use the header fields anyway, as a lying writer might.
    header.codec = static_cast<ckpt::proto::Codec>(data[6] % 4);
    header.filter = static_cast<ckpt::proto::Filter>(data[7] % 4);
    header.element_width = 1 + data[8] % 16;
    header.raw_size = static_cast<uint32_t>(data[20] | data[21] << 8 |
                                            (data[22] & 0x0f) << 16);
  }
  if (header.raw_size > (1u << 20) || header.element_width == 0) return 0;
  absl::Span<const uint8_t> stored(data + kChunkHeaderSize,
                                   size - kChunkHeaderSize);
  header.stored_size = static_cast<uint32_t>(stored.size());
  header.stored_xxh3 = Checksum(stored);
  std::vector<uint8_t> out(header.raw_size);
  (void)DecodeChunk(header, stored, absl::MakeSpan(out));
  return 0;
}
