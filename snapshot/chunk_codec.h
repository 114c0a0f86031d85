// The chunk codec: raw bytes -> (byte-shuffle filter) -> (zstd, over the whole
// chunk or plane by plane) -> stored bytes, each step checksummed with XXH3-64,
// and back. Encoding produces
// write-ready, O_DIRECT-aligned pieces: the 64-byte chunk header, the stored
// bytes and zero padding; a chunk stored raw is written from where its bytes
// lie when they are aligned (no copy). Decoding bounds every decompression by
// the declared raw size, so a lying header or a zstd bomb is an error, never an
// allocation.
//
// Thread-safety: both functions are thread-safe (zstd contexts are per thread).
#ifndef CKPT_SNAPSHOT_CHUNK_CODEC_H_
#define CKPT_SNAPSHOT_CHUNK_CODEC_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "io/aligned_buffer.h"
#include "proto/manifest.pb.h"
#include "snapshot/format.h"

struct XXH3_state_s;  // xxhash.h

namespace ckpt::snapshot {

// Smaller raw chunks are copied behind their header by default: padding the
// header to the alignment would cost more than the copy saves.
inline constexpr size_t kMinInPlaceBytes = 64 << 10;
// Smaller chunks are coded in one zstd frame: a frame per plane would cost
// more than coding planes apart gains.
inline constexpr size_t kMinPlanesBytes = 4 << 10;

struct CodecOptions {
  // The format the chunks (and the shard file) are written in, from
  // kOldestWrittenFormatVersion to kFormatVersion; byte planes need 4.
  uint32_t format_version = kFormatVersion;
  // CODEC_NONE stores every chunk raw; CODEC_ZSTD compresses when it pays.
  proto::Codec codec = proto::CODEC_ZSTD;
  int zstd_level = 1;
  // Byte-shuffle elements wider than one byte before compressing.
  bool shuffle = true;
  // Code the shuffled bytes' planes one by one (CODEC_ZSTD_PLANES, format 4:
  // snapshot/plane_codec.h) instead of in one zstd frame, for elements of
  // kMinPlaneWidth..kMaxPlaneWidth bytes in chunks of kMinPlanesBytes or more.
  bool planes = true;
  // A plane is stored raw unless compressing it saves this fraction.
  double min_plane_saving = 0.005;
  // A chunk is stored raw unless compression saves at least this fraction.
  double min_saving = 0.03;
  // Chunks larger than twice this are probed first: if a sample of this many
  // bytes does not compress, the chunk is stored raw without compressing the
  // rest. A 16 KiB sample of noise does not compress either, and it costs
  // less on chunks that do (one core, 4 MiB fp32 chunks: the codec ran
  // at 0.85-0.90 of byte-shuffle + zstd -1 with 64 KiB, 0.91-0.93 with 16 KiB,
  // 0.92 with no probe).
  size_t probe_bytes = 16 << 10;
  // A chunk stored raw whose bytes start at an aligned address and are at
  // least `min_in_place_bytes` is stored in place: its header is padded to the
  // alignment and its bytes are written from where they are, uncopied.
  bool in_place = true;
  size_t min_in_place_bytes = kMinInPlaceBytes;
};

// A chunk ready to be written at its file offset: `head`, then `body`, then
// `tail`, back to back; together a multiple of the alignment. `body` and `tail`
// are empty unless the chunk is stored in place: then `head` is the header
// padded with zeros to the alignment, `body` the aligned prefix of the raw
// bytes, borrowed from the caller, and `tail` the rest of them padded with
// zeros.
struct EncodedChunk {
  io::AlignedBuffer head;
  absl::Span<const uint8_t> body;
  io::AlignedBuffer tail;
  uint64_t size() const { return head.size() + body.size() + tail.size(); }
};

// The largest buffer EncodeChunk needs for a raw chunk of `raw_size` bytes.
size_t MaxEncodedSize(size_t raw_size);

// Encodes one chunk in options.format_version. Uses a buffer from
// `pool` when it is large enough (pool may be null). `header`'s item_index,
// chunk_index and raw_offset are inputs (they are written into the chunk
// header); the other fields are filled with what was written. A chunk stored in
// place borrows `raw`: it must stay valid and unchanged until written.
// `raw_xxh3`, when given, is Checksum(raw), already computed by the caller.
absl::StatusOr<EncodedChunk> EncodeChunk(
    absl::Span<const uint8_t> raw, uint32_t element_width,
    const CodecOptions& options, io::BufferPool* pool, ChunkHeader* header,
    std::optional<uint64_t> raw_xxh3 = std::nullopt);

// Decodes `stored` (header.stored_size bytes) into `raw_out` (header.raw_size
// bytes) and checks both checksums. Errors say which check failed; the caller
// adds file and chunk.
absl::Status DecodeChunk(const ChunkHeader& header,
                         absl::Span<const uint8_t> stored,
                         absl::Span<uint8_t> raw_out);

// XXH3-64 of `bytes`.
uint64_t Checksum(absl::Span<const uint8_t> bytes);

// Checksum of bytes given in pieces, in order: Digest() after Update(a),
// Update(b) is Checksum(a + b). For hashing a block while it is still in the
// cache after its copy.
class ChecksumStream {
 public:
  ChecksumStream();
  ~ChecksumStream();
  ChecksumStream(const ChecksumStream&) = delete;
  ChecksumStream& operator=(const ChecksumStream&) = delete;

  void Update(absl::Span<const uint8_t> bytes);
  uint64_t Digest() const;

 private:
  XXH3_state_s* state_;
};

// dst[i] ^= src[i] for every byte of dst (src at least as long): an XOR
// delta made, or undone (format 5).
void XorInto(absl::Span<uint8_t> dst, absl::Span<const uint8_t> src);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_CHUNK_CODEC_H_
