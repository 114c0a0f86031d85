// Byte-shuffle filter: regroups the bytes of fixed-width elements so byte k of
// every element is contiguous. Floating-point exponents (and the high bytes of
// small integers) then sit together and zstd finds far more redundancy. This is
// the CPU reference; kernels/ has device versions that must produce identical
// bytes.
//
// Thread-safety: pure functions, callable from any thread.
#ifndef CKPT_SNAPSHOT_FILTER_H_
#define CKPT_SNAPSHOT_FILTER_H_

#include <cstddef>
#include <cstdint>

namespace ckpt::snapshot {

// `n` bytes of `width`-byte elements from `src` to `dst` (no overlap). A tail
// of n % width bytes is copied unchanged after the shuffled part. width 1 is a
// plain copy.
void ByteShuffle(const uint8_t* src, uint8_t* dst, size_t n, size_t width);
void ByteUnshuffle(const uint8_t* src, uint8_t* dst, size_t n, size_t width);
// ByteUnshuffle of planes that need not lie back to back: byte b of element i
// is planes[b][i] (width 1 to 255), and the tail of n % width bytes is at
// `tail`.
void ByteUnshufflePlanes(const uint8_t* const* planes, const uint8_t* tail,
                         uint8_t* dst, size_t n, size_t width);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_FILTER_H_
