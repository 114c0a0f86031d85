// Per-thread zstd contexts and scratch buffers for the chunk codecs, and the
// one place where zstd's error codes become a Status.
//
// Thread-safety: every function returns this thread's own objects.
#ifndef CKPT_SNAPSHOT_ZSTD_CONTEXT_H_
#define CKPT_SNAPSHOT_ZSTD_CONTEXT_H_

#include <zstd.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ckpt::snapshot {

// DataLoss naming `what` and zstd's message for `code` (ZSTD_isError(code)).
absl::Status ZstdError(size_t code, absl::string_view what);

// This thread's contexts: one for whole-chunk frames (ZSTD_compressCCtx, which
// ignores advanced parameters), one whose parameters the plane codec sets, and
// one to decompress.
ZSTD_CCtx* ThreadCCtx();
ZSTD_CCtx* ThreadPlaneCCtx();
ZSTD_DCtx* ThreadDCtx();

// This thread's scratch buffer `which` (0 or 1) of at least `n` bytes, grown on
// demand and kept.
uint8_t* Scratch(size_t n, int which);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_ZSTD_CONTEXT_H_
