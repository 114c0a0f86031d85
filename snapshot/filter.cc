#include "snapshot/filter.h"

#include <cstring>

namespace ckpt::snapshot {
namespace {

// Fixed widths let the compiler unroll and vectorize the inner loops.
template <size_t W>
void Shuffle(const uint8_t* src, uint8_t* dst, size_t elements) {
  for (size_t i = 0; i < elements; ++i) {
    for (size_t b = 0; b < W; ++b) dst[b * elements + i] = src[i * W + b];
  }
}

template <size_t W>
void Unshuffle(const uint8_t* src, uint8_t* dst, size_t elements) {
  for (size_t i = 0; i < elements; ++i) {
    for (size_t b = 0; b < W; ++b) dst[i * W + b] = src[b * elements + i];
  }
}

}  // namespace

void ByteShuffle(const uint8_t* src, uint8_t* dst, size_t n, size_t width) {
  if (n == 0) return;
  if (width <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  size_t elements = n / width;
  switch (width) {
    case 2:
      Shuffle<2>(src, dst, elements);
      break;
    case 4:
      Shuffle<4>(src, dst, elements);
      break;
    case 8:
      Shuffle<8>(src, dst, elements);
      break;
    default:
      for (size_t i = 0; i < elements; ++i) {
        for (size_t b = 0; b < width; ++b)
          dst[b * elements + i] = src[i * width + b];
      }
  }
  size_t done = elements * width;
  std::memcpy(dst + done, src + done, n - done);
}

void ByteUnshuffle(const uint8_t* src, uint8_t* dst, size_t n, size_t width) {
  if (n == 0) return;
  if (width <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  size_t elements = n / width;
  switch (width) {
    case 2:
      Unshuffle<2>(src, dst, elements);
      break;
    case 4:
      Unshuffle<4>(src, dst, elements);
      break;
    case 8:
      Unshuffle<8>(src, dst, elements);
      break;
    default:
      for (size_t i = 0; i < elements; ++i) {
        for (size_t b = 0; b < width; ++b)
          dst[i * width + b] = src[b * elements + i];
      }
  }
  size_t done = elements * width;
  std::memcpy(dst + done, src + done, n - done);
}

}  // namespace ckpt::snapshot
