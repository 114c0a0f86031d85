// XXH3-64 (seed 0, the default secret: XXH3_64bits) written to run on the
// host and on a CUDA device alike: the chunk checksums a GPU computes while
// the bytes are still in device memory, and their CPU twin. Every result is
// bit-identical to libxxhash's XXH3_64bits (kernels/xxh3_test.cc compares
// them on every length up to a few KiB and on large random inputs).
//
// Inputs above 240 bytes are hashed in blocks of 1 KiB (16 stripes of 64
// bytes): each stripe adds a term to each of 8 accumulator lanes, the block's
// terms are summed (in any order: the sums wrap modulo 2^64), and the lanes
// are scrambled once per block. A warp of 32 threads takes one block at a
// time, each thread one lane of four stripes (ThreadTerms); the sums are
// exchanged across the warp. HashLongAsWarp runs that very decomposition on
// the host, thread by thread, so the CPU tests check the GPU's arithmetic.
#ifndef CKPT_KERNELS_XXH3_H_
#define CKPT_KERNELS_XXH3_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CKPT_HD __host__ __device__
#else
#define CKPT_HD
#endif

namespace ckpt::kernels::xxh3 {

// The default secret (XXH3_kSecret), as an initializer list.
#define CKPT_XXH3_SECRET                                                    \
  {                                                                         \
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, \
        0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97,   \
        0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79,   \
        0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc,   \
        0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e,   \
        0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52,   \
        0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53,   \
        0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38,   \
        0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f,   \
        0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f,   \
        0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f,   \
        0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34,   \
        0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,   \
        0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55,   \
        0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47,   \
        0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45,   \
        0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca,   \
        0xbb, 0x4b, 0x40, 0x7e                                              \
  }

inline constexpr size_t kSecretSize = 192;
inline constexpr size_t kStripe = 64;
inline constexpr int kStripesPerBlock = 16;  // (kSecretSize - kStripe) / 8
inline constexpr size_t kBlock = kStripe * kStripesPerBlock;
inline constexpr size_t kMidSizeMax = 240;
inline constexpr int kWarp = 32;

inline constexpr uint64_t kPrime32_1 = 0x9E3779B1U;
inline constexpr uint64_t kPrime32_2 = 0x85EBCA77U;
inline constexpr uint64_t kPrime32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ULL;

// Little-endian loads (both the host and the device are little-endian).
CKPT_HD inline uint64_t Read64(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    return *reinterpret_cast<const uint64_t*>(p);
  }
#endif
  uint64_t v;
  memcpy(&v, p, sizeof v);
  return v;
}
CKPT_HD inline uint32_t Read32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, sizeof v);
  return v;
}
CKPT_HD inline uint64_t Rotl64(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}
CKPT_HD inline uint64_t Swap64(uint64_t x) {
  return ((x << 56) & 0xff00000000000000ULL) |
         ((x << 40) & 0x00ff000000000000ULL) |
         ((x << 24) & 0x0000ff0000000000ULL) |
         ((x << 8) & 0x000000ff00000000ULL) |
         ((x >> 8) & 0x00000000ff000000ULL) |
         ((x >> 24) & 0x0000000000ff0000ULL) |
         ((x >> 40) & 0x000000000000ff00ULL) |
         ((x >> 56) & 0x00000000000000ffULL);
}
// The 128-bit product's halves, xored.
CKPT_HD inline uint64_t Mul128Fold64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}
CKPT_HD inline uint64_t Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}
CKPT_HD inline uint64_t Xxh64Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  return h ^ (h >> 32);
}
CKPT_HD inline uint64_t Rrmxmx(uint64_t h, uint64_t len) {
  h ^= Rotl64(h, 49) ^ Rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ULL;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ULL;
  return h ^ (h >> 28);
}
CKPT_HD inline uint64_t Mix16B(const uint8_t* in, const uint8_t* secret) {
  return Mul128Fold64(Read64(in) ^ Read64(secret),
                      Read64(in + 8) ^ Read64(secret + 8));
}

// Inputs of at most 240 bytes.
CKPT_HD inline uint64_t HashShort(const uint8_t* in, size_t len,
                                  const uint8_t* secret) {
  if (len > 128) {
    uint64_t acc = len * kPrime64_1;
    const int rounds = static_cast<int>(len / 16);
    for (int i = 0; i < 8; ++i) acc += Mix16B(in + 16 * i, secret + 16 * i);
    acc = Avalanche(acc);
    for (int i = 8; i < rounds; ++i) {
      acc += Mix16B(in + 16 * i, secret + 16 * (i - 8) + 3);
    }
    acc += Mix16B(in + len - 16, secret + 136 - 17);
    return Avalanche(acc);
  }
  if (len > 16) {
    uint64_t acc = len * kPrime64_1;
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += Mix16B(in + 48, secret + 96);
          acc += Mix16B(in + len - 64, secret + 112);
        }
        acc += Mix16B(in + 32, secret + 64);
        acc += Mix16B(in + len - 48, secret + 80);
      }
      acc += Mix16B(in + 16, secret + 32);
      acc += Mix16B(in + len - 32, secret + 48);
    }
    acc += Mix16B(in, secret);
    acc += Mix16B(in + len - 16, secret + 16);
    return Avalanche(acc);
  }
  if (len > 8) {
    const uint64_t lo =
        Read64(in) ^ (Read64(secret + 24) ^ Read64(secret + 32));
    const uint64_t hi =
        Read64(in + len - 8) ^ (Read64(secret + 40) ^ Read64(secret + 48));
    return Avalanche(len + Swap64(lo) + hi + Mul128Fold64(lo, hi));
  }
  if (len >= 4) {
    const uint64_t in64 =
        Read32(in + len - 4) + (static_cast<uint64_t>(Read32(in)) << 32);
    return Rrmxmx(in64 ^ (Read64(secret + 8) ^ Read64(secret + 16)), len);
  }
  if (len > 0) {
    const uint32_t combined = (static_cast<uint32_t>(in[0]) << 16) |
                              (static_cast<uint32_t>(in[len >> 1]) << 24) |
                              static_cast<uint32_t>(in[len - 1]) |
                              (static_cast<uint32_t>(len) << 8);
    return Xxh64Avalanche(
        combined ^ static_cast<uint64_t>(Read32(secret) ^ Read32(secret + 4)));
  }
  return Xxh64Avalanche(Read64(secret + 56) ^ Read64(secret + 64));
}

// Long inputs.

// The accumulator lanes' starting values.
CKPT_HD inline uint64_t InitialLane(int lane) {
  switch (lane) {
    case 0:
      return kPrime32_3;
    case 1:
      return kPrime64_1;
    case 2:
      return kPrime64_2;
    case 3:
      return kPrime64_3;
    case 4:
      return kPrime64_4;
    case 5:
      return kPrime32_2;
    case 6:
      return kPrime64_5;
    default:
      return kPrime32_1;
  }
}
// One stripe's terms for `lane`: `product` goes to accumulator `lane`,
// `value` to accumulator `lane ^ 1`.
CKPT_HD inline void StripeTerms(const uint8_t* stripe, const uint8_t* secret,
                                int lane, uint64_t* product, uint64_t* value) {
  const uint64_t v = Read64(stripe + 8 * lane);
  const uint64_t key = v ^ Read64(secret + 8 * lane);
  *value = v;
  *product = (key & 0xFFFFFFFFULL) * (key >> 32);
}
// Thread `t` of a warp, over a block's first `stripes` stripes: lane t % 8 of
// stripes t / 8, t / 8 + 4, t / 8 + 8, t / 8 + 12, summed.
CKPT_HD inline void ThreadTerms(const uint8_t* block, const uint8_t* secret,
                                int t, int stripes, uint64_t* product,
                                uint64_t* value) {
  uint64_t p = 0, v = 0;
  for (int s = t / 8; s < stripes; s += kWarp / 8) {
    uint64_t sp, sv;
    StripeTerms(block + s * kStripe, secret + 8 * s, t % 8, &sp, &sv);
    p += sp;
    v += sv;
  }
  *product = p;
  *value = v;
}
CKPT_HD inline uint64_t ScrambleLane(uint64_t acc, const uint8_t* secret,
                                     int lane) {
  acc ^= acc >> 47;
  acc ^= Read64(secret + kSecretSize - kStripe + 8 * lane);
  return acc * kPrime32_1;
}
CKPT_HD inline uint64_t MergeAccs(const uint64_t acc[8], const uint8_t* secret,
                                  uint64_t len) {
  uint64_t result = len * kPrime64_1;
  for (int i = 0; i < 4; ++i) {
    result += Mul128Fold64(acc[2 * i] ^ Read64(secret + 11 + 16 * i),
                           acc[2 * i + 1] ^ Read64(secret + 11 + 16 * i + 8));
  }
  return Avalanche(result);
}
// How a long input splits: whole blocks (each accumulated then scrambled),
// the stripes of the last partial block, and the last stripe (at len - 64,
// keyed at secret + 121).
CKPT_HD inline size_t WholeBlocks(size_t len) { return (len - 1) / kBlock; }
CKPT_HD inline int LastStripes(size_t len) {
  return static_cast<int>(((len - 1) - kBlock * WholeBlocks(len)) / kStripe);
}
inline constexpr size_t kLastStripeSecret = kSecretSize - kStripe - 7;

// A long input's walk: `accumulate(acc, at, key, stripes)` adds the terms of
// `stripes` stripes at `at` (keyed from `key`) to the 8 lanes of `acc`; whole
// blocks are then scrambled, and the lanes merged at the end.
template <typename Accumulate>
inline uint64_t HashLongWith(const uint8_t* in, size_t len,
                             const uint8_t* secret, Accumulate accumulate) {
  uint64_t acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = InitialLane(l);
  const size_t blocks = WholeBlocks(len);
  for (size_t b = 0; b < blocks; ++b) {
    accumulate(acc, in + b * kBlock, secret, kStripesPerBlock);
    for (int l = 0; l < 8; ++l) acc[l] = ScrambleLane(acc[l], secret, l);
  }
  accumulate(acc, in + blocks * kBlock, secret, LastStripes(len));
  accumulate(acc, in + len - kStripe, secret + kLastStripeSecret, 1);
  return MergeAccs(acc, secret, len);
}

// The serial algorithm, lane by lane (the reference for the decomposition).
inline uint64_t HashLong(const uint8_t* in, size_t len, const uint8_t* secret) {
  return HashLongWith(
      in, len, secret,
      [](uint64_t* acc, const uint8_t* at, const uint8_t* key, int stripes) {
        for (int s = 0; s < stripes; ++s) {
          for (int l = 0; l < 8; ++l) {
            uint64_t p, v;
            StripeTerms(at + s * kStripe, key + 8 * s, l, &p, &v);
            acc[l] += p;
            acc[l ^ 1] += v;
          }
        }
      });
}

// The warp's decomposition run on the host: 32 threads' ThreadTerms, summed
// per lane as the kernel's shuffles sum them.
inline uint64_t HashLongAsWarp(const uint8_t* in, size_t len,
                               const uint8_t* secret) {
  return HashLongWith(
      in, len, secret,
      [](uint64_t* acc, const uint8_t* at, const uint8_t* key, int stripes) {
        uint64_t product[kWarp], value[kWarp];
        for (int t = 0; t < kWarp; ++t) {
          ThreadTerms(at, key, t, stripes, &product[t], &value[t]);
        }
        // Lanes t, t ^ 8, t ^ 16, t ^ 24 share t % 8 (xor-shuffles by 8, 16).
        for (int t = 0; t < 8; ++t) {
          const uint64_t p =
              product[t] + product[t ^ 8] + product[t ^ 16] + product[t ^ 24];
          const int u = t ^ 1;  // the thread whose values go to lane t
          acc[t] += p + value[u] + value[u ^ 8] + value[u ^ 16] + value[u ^ 24];
        }
      });
}

// XXH3_64bits on the host.
inline uint64_t Hash(const uint8_t* in, size_t len) {
  static constexpr uint8_t kSecret[kSecretSize] = CKPT_XXH3_SECRET;
  return len <= kMidSizeMax ? HashShort(in, len, kSecret)
                            : HashLong(in, len, kSecret);
}

}  // namespace ckpt::kernels::xxh3

#endif  // CKPT_KERNELS_XXH3_H_
