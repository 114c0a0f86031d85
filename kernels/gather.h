// The GPU gather's per-thread work, written once for the device and the host
// (like kernels/shuffle.h): a block copies one table entry, each thread 16
// bytes at a time where both ends are 16-byte aligned, then the rest a byte at
// a time. GatherAsGrid runs every block and thread the way a grid does, on
// the host, so the CPU tests check the kernel's index arithmetic.
#ifndef CKPT_KERNELS_GATHER_H_
#define CKPT_KERNELS_GATHER_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/batch.h"

#if defined(__CUDACC__)
#define CKPT_GATHER_HD __host__ __device__
#else
#define CKPT_GATHER_HD
#endif

namespace ckpt::kernels::gather {

// Thread `t` of `threads`' part of copying `entry` to dst + entry.at.
CKPT_GATHER_HD inline void EntryPart(const TableEntry& entry, uint8_t* dst,
                                     size_t t, size_t threads) {
  uint8_t* out = dst + entry.at;
  size_t done = 0;
  if (((reinterpret_cast<uintptr_t>(entry.src) |
        reinterpret_cast<uintptr_t>(out)) &
       15) == 0) {
    const size_t vectors = entry.n / 16;
    for (size_t i = t; i < vectors; i += threads) {
#if defined(__CUDA_ARCH__)
      reinterpret_cast<uint4*>(out)[i] =
          reinterpret_cast<const uint4*>(entry.src)[i];
#else
      std::memcpy(out + 16 * i, entry.src + 16 * i, 16);
#endif
    }
    done = vectors * 16;
  }
  for (size_t i = done + t; i < entry.n; i += threads) out[i] = entry.src[i];
}

// The host's run of what a grid of `blocks` blocks of `threads` threads does
// with `gather`'s table.
inline void GatherAsGrid(const Batch& gather, uint8_t* dst, size_t blocks,
                         size_t threads) {
  const auto& table = gather.entries();
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t e = b; e < table.size(); e += blocks) {
      for (size_t t = 0; t < threads; ++t) {
        EntryPart(table[e], dst, t, threads);
      }
    }
  }
}

}  // namespace ckpt::kernels::gather

#endif  // CKPT_KERNELS_GATHER_H_
