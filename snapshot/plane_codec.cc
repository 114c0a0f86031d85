#include "snapshot/plane_codec.h"

#include <zstd.h>
#include <zstd_errors.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "snapshot/filter.h"
#include "snapshot/zstd_context.h"

namespace ckpt::snapshot {
namespace {

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// Sets this thread's plane context for `level` (see PlaneOptions::zstd_level).
absl::Status Configure(ZSTD_CCtx* cctx, int level) {
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  const bool literal_heavy = level <= 1;
  const size_t codes[] = {
      ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel,
                             literal_heavy ? 1 : level),
      literal_heavy ? ZSTD_CCtx_setParameter(cctx, ZSTD_c_hashLog, 6) : 0,
      literal_heavy ? ZSTD_CCtx_setParameter(cctx, ZSTD_c_minMatch, 7) : 0,
  };
  for (size_t code : codes) {
    if (ZSTD_isError(code)) return ZstdError(code, "plane parameters");
  }
  return absl::OkStatus();
}

// Compresses `plane` into `out` (room for `room` bytes) and returns the
// frame's size, or 0 when that would not save `min_saving` of the plane (a
// frame that does not fit the room, at least the plane's size, would not).
absl::StatusOr<size_t> CompressPlane(ZSTD_CCtx* cctx, const uint8_t* plane,
                                     size_t n, double min_saving, uint8_t* out,
                                     size_t room) {
  const size_t size = ZSTD_compress2(cctx, out, room, plane, n);
  if (ZSTD_isError(size)) {
    if (ZSTD_getErrorCode(size) == ZSTD_error_dstSize_tooSmall) return 0;
    return ZstdError(size, "compress plane");
  }
  // A frame as large as the plane would read as a raw plane.
  if (size >= n ||
      static_cast<double>(size) >= (1.0 - min_saving) * static_cast<double>(n))
    return 0;
  return size;
}

}  // namespace

absl::StatusOr<size_t> EncodePlanes(absl::Span<const uint8_t> raw, size_t width,
                                    const PlaneOptions& options, uint8_t* out) {
  if (width < kMinPlaneWidth || width > kMaxPlaneWidth) {
    return absl::InvalidArgumentError(
        absl::StrCat("plane codec: element width ", width));
  }
  const size_t n = raw.size();
  const size_t plane_size = n / width;
  uint8_t* shuffled = Scratch(n, 0);
  ByteShuffle(raw.data(), shuffled, n, width);
  ZSTD_CCtx* cctx = ThreadPlaneCCtx();
  if (absl::Status s = Configure(cctx, options.zstd_level); !s.ok()) return s;

  uint8_t* at = out + 4 * width;
  bool any_compressed = false;
  for (size_t b = 0; b < width; ++b) {
    const uint8_t* plane = shuffled + b * plane_size;
    size_t stored = 0;
    bool worth_trying = plane_size > 0;
    if (worth_trying && options.probe_bytes > 0 &&
        plane_size > 2 * options.probe_bytes) {
      const size_t probe_room = ZSTD_compressBound(options.probe_bytes);
      absl::StatusOr<size_t> probe =
          CompressPlane(cctx, plane, options.probe_bytes, options.min_saving,
                        Scratch(probe_room, 1), probe_room);
      if (!probe.ok()) return probe.status();
      worth_trying = *probe > 0;
    }
    if (worth_trying) {
      // The frame goes where the plane's stored bytes belong; one that saves
      // too little is overwritten by the raw plane. The room left holds every
      // remaining plane raw, so it is never less than this plane.
      const size_t room =
          PlanesStoredBound(n, width) - static_cast<size_t>(at - out);
      absl::StatusOr<size_t> size =
          CompressPlane(cctx, plane, plane_size, options.min_saving, at, room);
      if (!size.ok()) return size.status();
      stored = *size;
    }
    if (stored == 0) {
      stored = plane_size;
      std::memcpy(at, plane, plane_size);
    } else {
      any_compressed = true;
    }
    Put32(out + 4 * b, static_cast<uint32_t>(stored));
    at += stored;
  }
  if (!any_compressed) return 0;
  const size_t tail = n - plane_size * width;
  std::memcpy(at, shuffled + plane_size * width, tail);
  return static_cast<size_t>(at - out) + tail;
}

absl::Status DecodePlanes(absl::Span<const uint8_t> stored, size_t width,
                          absl::Span<uint8_t> raw_out) {
  if (width < kMinPlaneWidth || width > kMaxPlaneWidth) {
    return absl::DataLossError(
        absl::StrCat("plane codec: element width ", width));
  }
  const size_t n = raw_out.size();
  const size_t plane_size = n / width;
  const size_t tail = n - plane_size * width;
  if (stored.size() < 4 * width + tail) {
    return absl::DataLossError(absl::StrCat(
        "plane codec: ", stored.size(), " stored bytes cannot hold ", width,
        " plane sizes and a tail of ", tail));
  }
  uint64_t total = 4 * width + tail;
  for (size_t b = 0; b < width; ++b) {
    const uint32_t size = Get32(stored.data() + 4 * b);
    if (size > plane_size) {
      return absl::DataLossError(absl::StrCat("plane ", b, ": stored size ",
                                              size, " exceeds its raw size ",
                                              plane_size));
    }
    total += size;
  }
  if (total != stored.size()) {
    return absl::DataLossError(
        absl::StrCat("plane codec: planes and tail take ", total,
                     " bytes, the chunk stores ", stored.size()));
  }
  // Raw planes are unshuffled from where they lie; frames are decoded into
  // scratch first.
  uint8_t* scratch = Scratch(n, 0);
  const uint8_t* planes[kMaxPlaneWidth];
  const uint8_t* at = stored.data() + 4 * width;
  for (size_t b = 0; b < width; ++b) {
    const uint32_t size = Get32(stored.data() + 4 * b);
    if (size == plane_size) {
      planes[b] = at;
    } else {
      uint8_t* plane = scratch + b * plane_size;
      const unsigned long long declared = ZSTD_getFrameContentSize(at, size);
      if (declared != plane_size) {
        return absl::DataLossError(absl::StrCat(
            "plane ", b, ": zstd frame declares ",
            static_cast<int64_t>(declared), " bytes, the plane ", plane_size));
      }
      const size_t got =
          ZSTD_decompressDCtx(ThreadDCtx(), plane, plane_size, at, size);
      if (ZSTD_isError(got))
        return ZstdError(got, absl::StrCat("decompress plane ", b));
      if (got != plane_size) {
        return absl::DataLossError(absl::StrCat("plane ", b, ": decompressed ",
                                                got, " bytes of ", plane_size));
      }
      planes[b] = plane;
    }
    at += size;
  }
  ByteUnshufflePlanes(planes, at, raw_out.data(), n, width);
  return absl::OkStatus();
}

}  // namespace ckpt::snapshot
