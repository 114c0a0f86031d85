#include "snapshot/chunk_codec.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "io/status_macros.h"
#include "snapshot/filter.h"
#include "snapshot/plane_codec.h"
#include "snapshot/xxh3.h"
#include "snapshot/zstd_context.h"

namespace ckpt::snapshot {

uint64_t Checksum(absl::Span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

size_t MaxEncodedSize(size_t raw_size) {
  return ChunkFootprint(kChunkHeaderSize,
                        std::max(ZSTD_compressBound(raw_size),
                                 PlanesStoredBound(raw_size, kMaxPlaneWidth)));
}

absl::StatusOr<EncodedChunk> EncodeChunk(absl::Span<const uint8_t> raw,
                                         uint32_t element_width,
                                         const CodecOptions& options,
                                         io::BufferPool* pool,
                                         ChunkHeader* header,
                                         std::optional<uint64_t> raw_xxh3) {
  if (element_width == 0 || element_width > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("element width ", element_width));
  }
  RETURN_IF_ERROR(CheckWrittenFormat(options.format_version));
  const size_t raw_size = raw.size();
  const size_t max_size = MaxEncodedSize(raw_size);
  auto acquire = [&] {
    return (pool != nullptr && pool->buffer_capacity() >= max_size)
               ? pool->Acquire()
               : io::AlignedBuffer(max_size);
  };

  header->version = options.format_version;
  header->stored_offset = kChunkHeaderSize;
  header->element_width = element_width;
  header->raw_size = static_cast<uint32_t>(raw_size);
  header->raw_xxh3 = raw_xxh3.has_value() ? *raw_xxh3 : Checksum(raw);
  header->codec = proto::CODEC_NONE;
  header->filter = proto::FILTER_NONE;

  EncodedChunk chunk;
  io::AlignedBuffer& out = chunk.head;  // header, stored bytes, padding
  if (options.codec == proto::CODEC_ZSTD && raw_size > 0) {
    const bool shuffled = options.shuffle && element_width > 1;
    const double keep = 1.0 - options.min_saving;
    auto keep_if_smaller = [&](size_t n, proto::Codec codec, bool filtered) {
      if (static_cast<double>(n) >= keep * static_cast<double>(raw_size))
        return;
      header->codec = codec;
      header->filter =
          filtered ? proto::FILTER_BYTE_SHUFFLE : proto::FILTER_NONE;
      header->stored_size = static_cast<uint32_t>(n);
      header->stored_xxh3 = Checksum({out.data() + kChunkHeaderSize, n});
    };
    if (shuffled && options.planes &&
        options.format_version >= kPlanesFormatVersion &&
        element_width >= kMinPlaneWidth && element_width <= kMaxPlaneWidth &&
        raw_size >= kMinPlanesBytes) {
      // The plane codec probes each plane itself.
      out = acquire();
      absl::StatusOr<size_t> n =
          EncodePlanes(raw, element_width,
                       {.zstd_level = options.zstd_level,
                        .min_saving = options.min_plane_saving,
                        .probe_bytes = options.probe_bytes},
                       out.data() + kChunkHeaderSize);
      if (!n.ok()) return n.status();
      if (*n > 0) keep_if_smaller(*n, proto::CODEC_ZSTD_PLANES, true);
    } else {
      ZSTD_CCtx* cctx = ThreadCCtx();
      bool worth_trying = true;
      if (options.probe_bytes > 0 && raw_size > 2 * options.probe_bytes) {
        // The sample is filtered on its own: a prefix of the filtered chunk
        // would hold only the low bytes of its elements and misjudge it.
        size_t sample = options.probe_bytes / element_width * element_width;
        const uint8_t* probe_input = raw.data();
        if (shuffled) {
          uint8_t* filtered = Scratch(sample, 0);
          ByteShuffle(raw.data(), filtered, sample, element_width);
          probe_input = filtered;
        }
        size_t probe_cap = ZSTD_compressBound(sample);
        size_t probe =
            ZSTD_compressCCtx(cctx, Scratch(probe_cap, 1), probe_cap,
                              probe_input, sample, options.zstd_level);
        if (ZSTD_isError(probe)) return ZstdError(probe, "compress probe");
        worth_trying =
            static_cast<double>(probe) < keep * static_cast<double>(sample);
      }
      if (worth_trying) {
        const uint8_t* input = raw.data();
        if (shuffled) {
          uint8_t* filtered = Scratch(raw_size, 0);
          ByteShuffle(raw.data(), filtered, raw_size, element_width);
          input = filtered;
        }
        out = acquire();
        size_t n = ZSTD_compressCCtx(cctx, out.data() + kChunkHeaderSize,
                                     ZSTD_compressBound(raw_size), input,
                                     raw_size, options.zstd_level);
        if (ZSTD_isError(n)) return ZstdError(n, "compress");
        keep_if_smaller(n, proto::CODEC_ZSTD, shuffled);
      }
    }
  }

  if (header->codec == proto::CODEC_NONE) {
    header->stored_size = static_cast<uint32_t>(raw_size);
    header->stored_xxh3 = header->raw_xxh3;
    if (options.in_place && raw_size >= options.min_in_place_bytes &&
        io::IsAligned(reinterpret_cast<uintptr_t>(raw.data()), kAlignment)) {
      header->stored_offset = kAlignment;
      out = io::AlignedBuffer(kAlignment);
      std::memset(out.data(), 0, kAlignment);
      EncodeChunkHeader(*header, out.data());
      const size_t body = raw_size / kAlignment * kAlignment;
      chunk.body = raw.first(body);
      if (body < raw_size) {
        chunk.tail = io::AlignedBuffer(kAlignment);
        std::memset(chunk.tail.data(), 0, kAlignment);
        std::memcpy(chunk.tail.data(), raw.data() + body, raw_size - body);
      }
      return chunk;
    }
    if (out.empty()) out = acquire();
    if (raw_size > 0)
      std::memcpy(out.data() + kChunkHeaderSize, raw.data(), raw_size);
  }
  EncodeChunkHeader(*header, out.data());
  const size_t stored_end = kChunkHeaderSize + header->stored_size;
  const size_t footprint =
      ChunkFootprint(kChunkHeaderSize, header->stored_size);
  std::memset(out.data() + stored_end, 0, footprint - stored_end);
  out.set_size(footprint);
  return chunk;
}

absl::Status DecodeChunk(const ChunkHeader& header,
                         absl::Span<const uint8_t> stored,
                         absl::Span<uint8_t> raw_out) {
  if (stored.size() != header.stored_size ||
      raw_out.size() != header.raw_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode: buffers of ", stored.size(), "/", raw_out.size(),
        " bytes for a chunk of ", header.stored_size, "/", header.raw_size));
  }
  if (Checksum(stored) != header.stored_xxh3) {
    return absl::DataLossError("stored bytes checksum mismatch");
  }
  const size_t raw_size = header.raw_size;
  if (raw_size == 0) {
    // Writers never produce empty chunks; an empty one is only valid if it says
    // so exactly.
    if (header.codec != proto::CODEC_NONE || stored.size() != 0 ||
        header.raw_xxh3 != Checksum({})) {
      return absl::DataLossError(
          "empty chunk with a codec, stored bytes or a wrong checksum");
    }
    return absl::OkStatus();
  }
  bool shuffled = header.filter == proto::FILTER_BYTE_SHUFFLE;
  if (header.filter != proto::FILTER_NONE && !shuffled) {
    return absl::DataLossError(absl::StrCat("unknown filter ", header.filter));
  }
  switch (header.codec) {
    case proto::CODEC_NONE:
      if (stored.size() != raw_size) {
        return absl::DataLossError(
            "uncompressed chunk whose stored and raw sizes differ");
      }
      if (shuffled) {
        ByteUnshuffle(stored.data(), raw_out.data(), raw_size,
                      header.element_width);
      } else {
        std::memcpy(raw_out.data(), stored.data(), raw_size);
        // Identical bytes: the stored checksum already covered them.
        if (header.raw_xxh3 == header.stored_xxh3) return absl::OkStatus();
      }
      break;
    case proto::CODEC_ZSTD: {
      unsigned long long declared =
          ZSTD_getFrameContentSize(stored.data(), stored.size());
      if (declared == ZSTD_CONTENTSIZE_ERROR ||
          declared == ZSTD_CONTENTSIZE_UNKNOWN || declared != raw_size) {
        return absl::DataLossError(absl::StrCat(
            "zstd frame declares ", declared, " bytes, the chunk ", raw_size));
      }
      uint8_t* dst = shuffled ? Scratch(raw_size, 0) : raw_out.data();
      size_t n = ZSTD_decompressDCtx(ThreadDCtx(), dst, raw_size, stored.data(),
                                     stored.size());
      if (ZSTD_isError(n)) return ZstdError(n, "decompress");
      if (n != raw_size) {
        return absl::DataLossError(
            absl::StrCat("decompressed ", n, " bytes, expected ", raw_size));
      }
      if (shuffled)
        ByteUnshuffle(dst, raw_out.data(), raw_size, header.element_width);
      break;
    }
    case proto::CODEC_ZSTD_PLANES:
      if (!shuffled || header.version < kPlanesFormatVersion) {
        return absl::DataLossError(absl::StrCat(
            "byte planes without the byte-shuffle filter or in format ",
            header.version));
      }
      RETURN_IF_ERROR(DecodePlanes(stored, header.element_width, raw_out));
      break;
    default:
      return absl::DataLossError(absl::StrCat("unknown codec ", header.codec));
  }
  if (Checksum(raw_out) != header.raw_xxh3) {
    return absl::DataLossError("raw bytes checksum mismatch after decoding");
  }
  return absl::OkStatus();
}

}  // namespace ckpt::snapshot
