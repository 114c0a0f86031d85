// Casts of a tensor's elements applied when a step is published (issue #37),
// bit-identical to PyTorch's.
//
// Thread-safety: stateless functions.
#ifndef CKPT_SNAPSHOT_CAST_H_
#define CKPT_SNAPSHOT_CAST_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ckpt::snapshot {

// One float32's bfloat16: rounded to nearest, ties to even; every NaN becomes
// the quiet NaN 0x7FC0 (c10::BFloat16's round_to_nearest_even).
inline uint16_t Bfloat16Of(uint32_t float_bits) {
  if ((float_bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  const uint32_t rounding_bias = ((float_bits >> 16) & 1) + 0x7FFFu;
  return static_cast<uint16_t>((float_bits + rounding_bias) >> 16);
}

// float32 elements of `src` (little-endian) into bfloat16 elements of `dst`:
// `dst` holds half as many bytes. InvalidArgument when the sizes disagree.
absl::Status CastFloat32ToBfloat16(absl::Span<const uint8_t> src,
                                   absl::Span<uint8_t> dst);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_CAST_H_
