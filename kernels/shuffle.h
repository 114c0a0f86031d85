// The GPU byte-shuffle's per-thread work, written once for the device and the
// host (like kernels/xxh3.h): for W-byte elements (W = 2, 4 or 8), a thread
// takes a group of four elements (4 * W bytes, one vector load on the device)
// and writes 4 bytes to each of the W planes; the last elements % 4 elements
// and the n % W tail bytes go a byte per thread. ShuffleAsGrid runs every
// group and byte the way a grid does, on the host, so the CPU tests check the
// kernel's index arithmetic against snapshot::ByteShuffle.
#ifndef CKPT_KERNELS_SHUFFLE_H_
#define CKPT_KERNELS_SHUFFLE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CKPT_SHUFFLE_HD __host__ __device__
#else
#define CKPT_SHUFFLE_HD
#endif

namespace ckpt::kernels::shuffle {

// Whether groups may store their 4 bytes per plane as one 32-bit word.
CKPT_SHUFFLE_HD inline bool WordStores(const uint8_t* dst, size_t elements) {
  return elements % 4 == 0 && (reinterpret_cast<uintptr_t>(dst) & 3) == 0;
}

// Group `g`: elements [4g, 4g + 4) of `src` (16-byte aligned on the device)
// to their places in the planes of `dst`.
template <int W>
CKPT_SHUFFLE_HD inline void Group(const uint8_t* src, uint8_t* dst,
                                  size_t elements, size_t g, bool words) {
  static_assert(W == 2 || W == 4 || W == 8, "2-, 4- or 8-byte elements");
  uint8_t in[4 * W];
  const uint8_t* p = src + g * 4 * W;
#if defined(__CUDA_ARCH__)
  if constexpr (W == 2) {
    *reinterpret_cast<uint2*>(in) = *reinterpret_cast<const uint2*>(p);
  } else {
#pragma unroll
    for (int v = 0; v < W / 4; ++v) {
      reinterpret_cast<uint4*>(in)[v] = reinterpret_cast<const uint4*>(p)[v];
    }
  }
#else
  std::memcpy(in, p, sizeof in);
#endif
#pragma unroll
  for (int b = 0; b < W; ++b) {
    uint8_t* q = dst + b * elements + 4 * g;
    if (words) {
      const uint32_t word = in[b] | static_cast<uint32_t>(in[W + b]) << 8 |
                            static_cast<uint32_t>(in[2 * W + b]) << 16 |
                            static_cast<uint32_t>(in[3 * W + b]) << 24;
#if defined(__CUDA_ARCH__)
      *reinterpret_cast<uint32_t*>(q) = word;
#else
      std::memcpy(q, &word, sizeof word);
#endif
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) q[j] = in[j * W + b];
    }
  }
}

// Byte `k` of the bytes the groups leave (k >= groups * 4 * W).
template <int W>
CKPT_SHUFFLE_HD inline void TailByte(const uint8_t* src, uint8_t* dst,
                                     size_t elements, size_t k) {
  if (k < elements * W) {
    dst[(k % W) * elements + k / W] = src[k];
  } else {
    dst[k] = src[k];
  }
}

// The host's run of what a grid of `threads` threads does.
template <int W>
inline void ShuffleAsGrid(const uint8_t* src, uint8_t* dst, size_t n,
                          size_t threads) {
  const size_t elements = n / W, groups = elements / 4;
  const bool words = WordStores(dst, elements);
  for (size_t t = 0; t < threads; ++t) {
    for (size_t g = t; g < groups; g += threads) {
      Group<W>(src, dst, elements, g, words);
    }
    for (size_t k = groups * 4 * W + t; k < n; k += threads) {
      TailByte<W>(src, dst, elements, k);
    }
  }
}

}  // namespace ckpt::kernels::shuffle

#endif  // CKPT_KERNELS_SHUFFLE_H_
