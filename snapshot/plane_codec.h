// The byte-plane codec (CODEC_ZSTD_PLANES, format 4): a chunk of `width`-byte
// elements, byte-shuffled, is `width` planes of n / width bytes (plane b holds
// byte b of every element) and a tail of n % width bytes. Each plane is coded
// on its own:
//   - a float's sign-and-exponent plane is nearly all literals: zstd with a
//     tiny match table (hash log 6, matches of 7 bytes or more) codes it by
//     Huffman in half the time of zstd -1, and smaller (measured on real
//     training state: 0.316 of its size vs 0.323);
//   - low mantissa planes are noise (zstd saves 0.2% of them): they are stored
//     as they are, without running a compressor over them.
// Together this is about twice as fast as byte-shuffle + zstd -1 over the
// whole chunk, for the same stored size.
//
// Stored bytes: the stored size of each plane (u32, little-endian, `width` of
// them), the planes' stored bytes in plane order, then the tail as it is. A
// plane whose stored size equals its raw size is stored raw; a smaller one is
// one zstd frame that records its content size; a larger one is an error.
//
// Thread-safety: thread-safe (zstd contexts and scratch are per thread).
#ifndef CKPT_SNAPSHOT_PLANE_CODEC_H_
#define CKPT_SNAPSHOT_PLANE_CODEC_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ckpt::snapshot {

// Element widths the plane codec takes.
inline constexpr size_t kMinPlaneWidth = 2;
inline constexpr size_t kMaxPlaneWidth = 16;

// The most stored bytes the plane codec writes for `raw_size` raw bytes.
inline constexpr size_t PlanesStoredBound(size_t raw_size, size_t width) {
  return 4 * width + raw_size;
}

struct PlaneOptions {
  // 1 (or less): the literal-heavy parameters above; higher: zstd's own
  // parameters for that level, on every plane that compresses.
  int zstd_level = 1;
  // A plane is stored raw unless compressing saves at least this fraction of
  // it (a 4 MiB fp32 chunk's high mantissa plane saves about 1.1%).
  double min_saving = 0.005;
  // Planes larger than twice this are probed: their first `probe_bytes` are
  // compressed first, and a plane whose sample does not compress is stored
  // raw without compressing the rest.
  size_t probe_bytes = 16 << 10;
};

// Encodes `raw` (elements of `width` bytes, kMinPlaneWidth..kMaxPlaneWidth)
// into `out`, which has room for PlanesStoredBound(raw.size(), width) bytes,
// and returns the stored size; 0 when no plane compresses, so that the caller
// stores the chunk raw.
absl::StatusOr<size_t> EncodePlanes(absl::Span<const uint8_t> raw, size_t width,
                                    const PlaneOptions& options, uint8_t* out);

// Decodes `stored` into `raw_out` (the chunk's raw size). Every size is checked
// against the raw size before it is trusted and every decompression is bounded
// by its plane's size. Does not check the raw checksum: the caller does.
absl::Status DecodePlanes(absl::Span<const uint8_t> stored, size_t width,
                          absl::Span<uint8_t> raw_out);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_PLANE_CODEC_H_
