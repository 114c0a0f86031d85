#include "snapshot/zstd_context.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt::snapshot {
namespace {

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

}  // namespace

absl::Status ZstdError(size_t code, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat(what, ": zstd: ", ZSTD_getErrorName(code)));
}

ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx(ZSTD_createCCtx());
  return ctx.get();
}

ZSTD_CCtx* ThreadPlaneCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx(ZSTD_createCCtx());
  return ctx.get();
}

ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx(ZSTD_createDCtx());
  return ctx.get();
}

uint8_t* Scratch(size_t n, int which) {
  thread_local std::vector<uint8_t> scratch[2];
  if (scratch[which].size() < n) scratch[which].resize(n);
  return scratch[which].data();
}

}  // namespace ckpt::snapshot
