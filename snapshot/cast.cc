#include "snapshot/cast.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt::snapshot {

absl::Status CastFloat32ToBfloat16(absl::Span<const uint8_t> src,
                                   absl::Span<uint8_t> dst) {
  if (src.size() % 4 != 0 || dst.size() * 2 != src.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("casting ", src.size(), " bytes of float32 into ",
                     dst.size(), " bytes of bfloat16"));
  }
  const size_t n = src.size() / 4;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src.data() + 4 * i, 4);
    const uint16_t half = Bfloat16Of(bits);
    std::memcpy(dst.data() + 2 * i, &half, 2);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::snapshot
