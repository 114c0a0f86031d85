#include "snapshot/filter.h"

#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ckpt::snapshot {
namespace {

// Element-major -> byte-plane-major for elements [begin, elements). A fixed W
// lets the compiler unroll; W == 0 means "use `width`".
template <size_t W>
void ToPlanes(const uint8_t* src, uint8_t* dst, size_t begin, size_t elements,
              size_t width) {
  const size_t w = W != 0 ? W : width;
  for (size_t i = begin; i < elements; ++i) {
    for (size_t b = 0; b < w; ++b) dst[b * elements + i] = src[i * w + b];
  }
}

// The inverse, reading plane b through planes[b]: the planes need not lie
// back to back.
template <size_t W>
void FromPlanes(const uint8_t* const* planes, uint8_t* dst, size_t begin,
                size_t elements, size_t width) {
  const size_t w = W != 0 ? W : width;
  for (size_t i = begin; i < elements; ++i) {
    for (size_t b = 0; b < w; ++b) dst[i * w + b] = planes[b][i];
  }
}

#if defined(__SSE2__)
// The same transforms 16 elements at a time with SSE2 (every x86-64 CPU has
// it); they return how many elements they did, the rest is Planes' work.

__m128i Load(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
void Store(uint8_t* p, __m128i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
}

size_t Shuffle2(const uint8_t* src, uint8_t* dst, size_t elements) {
  const __m128i low = _mm_set1_epi16(0x00ff);
  size_t i = 0;
  for (; i + 16 <= elements; i += 16) {
    const __m128i a = Load(src + 2 * i), b = Load(src + 2 * i + 16);
    Store(dst + i,
          _mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(b, low)));
    Store(dst + elements + i,
          _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
  }
  return i;
}

size_t Unshuffle2(const uint8_t* const* planes, uint8_t* dst, size_t elements) {
  size_t i = 0;
  for (; i + 16 <= elements; i += 16) {
    const __m128i p0 = Load(planes[0] + i), p1 = Load(planes[1] + i);
    Store(dst + 2 * i, _mm_unpacklo_epi8(p0, p1));
    Store(dst + 2 * i + 16, _mm_unpackhi_epi8(p0, p1));
  }
  return i;
}

size_t Shuffle4(const uint8_t* src, uint8_t* dst, size_t elements) {
  size_t i = 0;
  for (; i + 16 <= elements; i += 16) {
    // Rows: elements 0-3, 4-7, 8-11, 12-15 of four bytes each. Three rounds
    // of byte interleaving gather each byte position of eight elements.
    const __m128i v0 = Load(src + 4 * i), v1 = Load(src + 4 * i + 16);
    const __m128i v2 = Load(src + 4 * i + 32), v3 = Load(src + 4 * i + 48);
    const __m128i a = _mm_unpacklo_epi8(v0, v1), b = _mm_unpackhi_epi8(v0, v1);
    const __m128i c = _mm_unpacklo_epi8(v2, v3), d = _mm_unpackhi_epi8(v2, v3);
    const __m128i a2 = _mm_unpacklo_epi8(a, b), b2 = _mm_unpackhi_epi8(a, b);
    const __m128i c2 = _mm_unpacklo_epi8(c, d), d2 = _mm_unpackhi_epi8(c, d);
    // Planes 0|1 and 2|3 of elements 0-7 and of 8-15.
    const __m128i a3 = _mm_unpacklo_epi8(a2, b2),
                  b3 = _mm_unpackhi_epi8(a2, b2);
    const __m128i c3 = _mm_unpacklo_epi8(c2, d2),
                  d3 = _mm_unpackhi_epi8(c2, d2);
    Store(dst + i, _mm_unpacklo_epi64(a3, c3));
    Store(dst + elements + i, _mm_unpackhi_epi64(a3, c3));
    Store(dst + 2 * elements + i, _mm_unpacklo_epi64(b3, d3));
    Store(dst + 3 * elements + i, _mm_unpackhi_epi64(b3, d3));
  }
  return i;
}

size_t Unshuffle4(const uint8_t* const* planes, uint8_t* dst, size_t elements) {
  size_t i = 0;
  for (; i + 16 <= elements; i += 16) {
    const __m128i p0 = Load(planes[0] + i), p1 = Load(planes[1] + i);
    const __m128i p2 = Load(planes[2] + i), p3 = Load(planes[3] + i);
    // Bytes 0|1 and 2|3 of each element, then whole elements.
    const __m128i lo01 = _mm_unpacklo_epi8(p0, p1);
    const __m128i lo23 = _mm_unpacklo_epi8(p2, p3);
    const __m128i hi01 = _mm_unpackhi_epi8(p0, p1);
    const __m128i hi23 = _mm_unpackhi_epi8(p2, p3);
    Store(dst + 4 * i, _mm_unpacklo_epi16(lo01, lo23));
    Store(dst + 4 * i + 16, _mm_unpackhi_epi16(lo01, lo23));
    Store(dst + 4 * i + 32, _mm_unpacklo_epi16(hi01, hi23));
    Store(dst + 4 * i + 48, _mm_unpackhi_epi16(hi01, hi23));
  }
  return i;
}
#else
size_t Shuffle2(const uint8_t*, uint8_t*, size_t) { return 0; }
size_t Unshuffle2(const uint8_t* const*, uint8_t*, size_t) { return 0; }
size_t Shuffle4(const uint8_t*, uint8_t*, size_t) { return 0; }
size_t Unshuffle4(const uint8_t* const*, uint8_t*, size_t) { return 0; }
#endif

}  // namespace

void ByteShuffle(const uint8_t* src, uint8_t* dst, size_t n, size_t width) {
  if (n == 0) return;
  if (width <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  const size_t elements = n / width;
  switch (width) {
    case 2:
      ToPlanes<2>(src, dst, Shuffle2(src, dst, elements), elements, width);
      break;
    case 4:
      ToPlanes<4>(src, dst, Shuffle4(src, dst, elements), elements, width);
      break;
    case 8:
      ToPlanes<8>(src, dst, 0, elements, width);
      break;
    default:
      ToPlanes<0>(src, dst, 0, elements, width);
  }
  const size_t done = elements * width;
  std::memcpy(dst + done, src + done, n - done);
}

void ByteUnshufflePlanes(const uint8_t* const* planes, const uint8_t* tail,
                         uint8_t* dst, size_t n, size_t width) {
  if (n == 0) return;
  const size_t elements = n / width;
  switch (width) {
    case 1:
      std::memcpy(dst, planes[0], elements);
      break;
    case 2:
      FromPlanes<2>(planes, dst, Unshuffle2(planes, dst, elements), elements,
                    width);
      break;
    case 4:
      FromPlanes<4>(planes, dst, Unshuffle4(planes, dst, elements), elements,
                    width);
      break;
    case 8:
      FromPlanes<8>(planes, dst, 0, elements, width);
      break;
    default:
      FromPlanes<0>(planes, dst, 0, elements, width);
  }
  const size_t done = elements * width;
  std::memcpy(dst + done, tail, n - done);
}

void ByteUnshuffle(const uint8_t* src, uint8_t* dst, size_t n, size_t width) {
  if (width <= 1) {
    if (n > 0) std::memcpy(dst, src, n);
    return;
  }
  const size_t elements = n / width;
  if (width > 255) {
    for (size_t i = 0; i < elements; ++i) {
      for (size_t b = 0; b < width; ++b)
        dst[i * width + b] = src[b * elements + i];
    }
    std::memcpy(dst + elements * width, src + elements * width,
                n - elements * width);
    return;
  }
  const uint8_t* planes[255];
  for (size_t b = 0; b < width; ++b) planes[b] = src + b * elements;
  ByteUnshufflePlanes(planes, src + elements * width, dst, n, width);
}

}  // namespace ckpt::snapshot
