// ParallelHostCopy copies a save's host tensors into its staging slot with
// several threads: one core's memcpy is well below what the memory bus gives,
// and while it runs the trainer waits in WaitStaged. Large tensors are split
// into pieces that the threads take in turn. ParallelCopyAndHash does the
// same and hashes the chunks as it copies them, in one pass over memory.
#ifndef CKPT_CLIENT_PARALLEL_COPY_H_
#define CKPT_CLIENT_PARALLEL_COPY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "io/parallel.h"

namespace ckpt::client {

struct CopyRegion {
  const void* src;
  void* dst;
  size_t bytes;
};

// The threads a copy of `total_bytes` uses: CKPT_COPY_THREADS when set (1 =
// copy on the calling thread only), else up to the cores there are, at most 8,
// one per 32 MiB.
int CopyThreadsFor(size_t total_bytes);

// Copies every region (host memory to host memory) with `threads` threads,
// the calling thread among them.
void ParallelHostCopy(const std::vector<CopyRegion>& regions, int threads);

// A region copied into a staging slot, its bytes hashed in runs of the
// chunk size as they are copied: `xxh3` receives one hash per run.
struct HashedCopyRegion {
  const void* src;
  void* dst;
  size_t bytes;
  uint64_t* xxh3;
};

// Copies `bytes` from `src` to `dst` in blocks small enough to stay in the
// core's cache, each hashed right after its copy; returns the
// snapshot::Checksum of the bytes written (memory is read once). From 64 KiB
// on x86-64 the stores stream past the cache (StreamingCopy) and each block
// is hashed from the source lines its loads brought in; CKPT_COPY_STREAMING=0
// copies with memcpy instead.
uint64_t CopyAndChecksum(void* dst, const void* src, size_t bytes);

// memcpy with non-temporal stores (x86-64; memcpy elsewhere): the
// destination's lines are neither read first nor kept in the cache, which a
// copy into a staging slot that only another process reads later gains from
// (glibc's memcpy streams only copies larger than most of the cache).
// Ordered (sfence) before it returns.
void StreamingCopy(void* dst, const void* src, size_t bytes);
// Whether CopyAndChecksum streams (x86-64 and CKPT_COPY_STREAMING is not 0).
bool StreamingStores();

// Copies and hashes in one pass: each `chunk_size` run of every region on
// one thread, in blocks small enough to stay in the core's cache, each block
// hashed (snapshot::ChecksumStream, of the bytes written) right after its
// copy, so that memory is read once. The hashes equal snapshot::Checksum of
// each run copied.
void ParallelCopyAndHash(const std::vector<HashedCopyRegion>& regions,
                         uint32_t chunk_size, int threads);

// Runs fn(0) ... fn(n - 1) on `threads` threads, the calling thread among
// them (io/parallel.h: fewer when the system refuses a thread).
using io::ParallelFor;

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_PARALLEL_COPY_H_
