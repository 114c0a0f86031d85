#include "snapshot/filter.h"

#include <cstring>

namespace ckpt::snapshot {
namespace {

// kForward: element-major -> byte-plane-major; else the inverse. A fixed W lets
// the compiler unroll and vectorize; W == 0 means "use `width`".
template <bool kForward, size_t W>
void Planes(const uint8_t* src, uint8_t* dst, size_t elements, size_t width) {
  const size_t w = W != 0 ? W : width;
  for (size_t i = 0; i < elements; ++i) {
    for (size_t b = 0; b < w; ++b) {
      if constexpr (kForward) {
        dst[b * elements + i] = src[i * w + b];
      } else {
        dst[i * w + b] = src[b * elements + i];
      }
    }
  }
}

template <bool kForward>
void Transform(const uint8_t* src, uint8_t* dst, size_t n, size_t width) {
  if (n == 0) return;
  if (width <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  const size_t elements = n / width;
  switch (width) {
    case 2:
      Planes<kForward, 2>(src, dst, elements, width);
      break;
    case 4:
      Planes<kForward, 4>(src, dst, elements, width);
      break;
    case 8:
      Planes<kForward, 8>(src, dst, elements, width);
      break;
    default:
      Planes<kForward, 0>(src, dst, elements, width);
  }
  const size_t done = elements * width;
  std::memcpy(dst + done, src + done, n - done);
}

}  // namespace

void ByteShuffle(const uint8_t* src, uint8_t* dst, size_t n, size_t width) {
  Transform<true>(src, dst, n, width);
}

void ByteUnshuffle(const uint8_t* src, uint8_t* dst, size_t n, size_t width) {
  Transform<false>(src, dst, n, width);
}

}  // namespace ckpt::snapshot
