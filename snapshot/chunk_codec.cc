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

ChecksumStream::ChecksumStream() : state_(XXH3_createState()) {
  XXH3_64bits_reset(state_);
}

ChecksumStream::~ChecksumStream() { XXH3_freeState(state_); }

void ChecksumStream::Update(absl::Span<const uint8_t> bytes) {
  XXH3_64bits_update(state_, bytes.data(), bytes.size());
}

uint64_t ChecksumStream::Digest() const { return XXH3_64bits_digest(state_); }

size_t MaxEncodedSize(size_t raw_size) {
  return ChunkFootprint(kChunkHeaderSize,
                        std::max(ZSTD_compressBound(raw_size),
                                 PlanesStoredBound(raw_size, kMaxPlaneWidth)));
}

namespace {

// What EncodeChunk codes one chunk with: the raw bytes, their element width,
// the options, and the buffer the header and stored bytes go to.
class ChunkEncoder {
 public:
  ChunkEncoder(absl::Span<const uint8_t> raw, uint32_t element_width,
               const CodecOptions& options, io::BufferPool* pool,
               ChunkHeader* header)
      : raw_(raw),
        width_(element_width),
        options_(options),
        pool_(pool),
        header_(*header),
        shuffled_(options.shuffle && element_width > 1),
        keep_(1.0 - options.min_saving) {}

  // Compressed, if that saves enough: byte planes where they apply, else
  // (shuffled) zstd of the whole chunk.
  absl::Status Compress() {
    if (options_.codec != proto::CODEC_ZSTD || raw_.empty()) {
      return absl::OkStatus();
    }
    if (PlanesApply()) return TryPlanes();
    ASSIGN_OR_RETURN(const bool worth_trying, ProbeSaysWorthTrying());
    if (!worth_trying) return absl::OkStatus();
    return TryZstd();
  }

  // Not compressed: stored raw, in place (borrowing `raw`) when it may be,
  // else copied after the header.
  std::optional<EncodedChunk> StoreRaw() {
    header_.stored_size = static_cast<uint32_t>(raw_.size());
    header_.stored_xxh3 = header_.raw_xxh3;
    if (options_.in_place && raw_.size() >= options_.min_in_place_bytes &&
        io::IsAligned(reinterpret_cast<uintptr_t>(raw_.data()), kAlignment)) {
      return InPlace();
    }
    if (out_.empty()) out_ = Acquire();
    if (!raw_.empty()) {
      std::memcpy(out_.data() + kChunkHeaderSize, raw_.data(), raw_.size());
    }
    return std::nullopt;
  }

  // The header written, the stored bytes padded with zeros to the footprint.
  EncodedChunk Finish() {
    EncodeChunkHeader(header_, out_.data());
    const size_t stored_end = kChunkHeaderSize + header_.stored_size;
    const size_t footprint =
        ChunkFootprint(kChunkHeaderSize, header_.stored_size);
    std::memset(out_.data() + stored_end, 0, footprint - stored_end);
    out_.set_size(footprint);
    EncodedChunk chunk;
    chunk.head = std::move(out_);
    return chunk;
  }

 private:
  io::AlignedBuffer Acquire() const {
    const size_t max_size = MaxEncodedSize(raw_.size());
    return (pool_ != nullptr && pool_->buffer_capacity() >= max_size)
               ? pool_->Acquire()
               : io::AlignedBuffer(max_size);
  }

  bool PlanesApply() const {
    return shuffled_ && options_.planes &&
           options_.format_version >= kPlanesFormatVersion &&
           width_ >= kMinPlaneWidth && width_ <= kMaxPlaneWidth &&
           raw_.size() >= kMinPlanesBytes;
  }

  // Keeps the `n` bytes coded after the header if they save enough.
  void KeepIfSmaller(size_t n, proto::Codec codec, bool filtered) {
    if (static_cast<double>(n) >= keep_ * static_cast<double>(raw_.size())) {
      return;
    }
    header_.codec = codec;
    header_.filter = filtered ? proto::FILTER_BYTE_SHUFFLE : proto::FILTER_NONE;
    header_.stored_size = static_cast<uint32_t>(n);
    header_.stored_xxh3 = Checksum({out_.data() + kChunkHeaderSize, n});
  }

  // The plane codec probes each plane itself.
  absl::Status TryPlanes() {
    out_ = Acquire();
    ASSIGN_OR_RETURN(const size_t n,
                     EncodePlanes(raw_, width_,
                                  {.zstd_level = options_.zstd_level,
                                   .min_saving = options_.min_plane_saving,
                                   .probe_bytes = options_.probe_bytes},
                                  out_.data() + kChunkHeaderSize));
    if (n > 0) KeepIfSmaller(n, proto::CODEC_ZSTD_PLANES, true);
    return absl::OkStatus();
  }

  // A large chunk is compressed only if a sample of it compresses well. The
  // sample is filtered on its own: a prefix of the filtered chunk would hold
  // only the low bytes of its elements and misjudge it.
  absl::StatusOr<bool> ProbeSaysWorthTrying() {
    if (options_.probe_bytes == 0 || raw_.size() <= 2 * options_.probe_bytes) {
      return true;
    }
    const size_t sample = options_.probe_bytes / width_ * width_;
    const uint8_t* probe_input = raw_.data();
    if (shuffled_) {
      uint8_t* filtered = Scratch(sample, 0);
      ByteShuffle(raw_.data(), filtered, sample, width_);
      probe_input = filtered;
    }
    const size_t probe_cap = ZSTD_compressBound(sample);
    const size_t probe =
        ZSTD_compressCCtx(ThreadCCtx(), Scratch(probe_cap, 1), probe_cap,
                          probe_input, sample, options_.zstd_level);
    if (ZSTD_isError(probe)) return ZstdError(probe, "compress probe");
    return static_cast<double>(probe) < keep_ * static_cast<double>(sample);
  }

  absl::Status TryZstd() {
    const uint8_t* input = raw_.data();
    if (shuffled_) {
      uint8_t* filtered = Scratch(raw_.size(), 0);
      ByteShuffle(raw_.data(), filtered, raw_.size(), width_);
      input = filtered;
    }
    out_ = Acquire();
    const size_t n =
        ZSTD_compressCCtx(ThreadCCtx(), out_.data() + kChunkHeaderSize,
                          ZSTD_compressBound(raw_.size()), input, raw_.size(),
                          options_.zstd_level);
    if (ZSTD_isError(n)) return ZstdError(n, "compress");
    KeepIfSmaller(n, proto::CODEC_ZSTD, shuffled_);
    return absl::OkStatus();
  }

  // The header padded to the alignment, the aligned prefix borrowed, the
  // rest copied into a padded tail.
  EncodedChunk InPlace() {
    header_.stored_offset = kAlignment;
    EncodedChunk chunk;
    chunk.head = io::AlignedBuffer(kAlignment);
    std::memset(chunk.head.data(), 0, kAlignment);
    EncodeChunkHeader(header_, chunk.head.data());
    const size_t body = raw_.size() / kAlignment * kAlignment;
    chunk.body = raw_.first(body);
    if (body < raw_.size()) {
      chunk.tail = io::AlignedBuffer(kAlignment);
      std::memset(chunk.tail.data(), 0, kAlignment);
      std::memcpy(chunk.tail.data(), raw_.data() + body, raw_.size() - body);
    }
    return chunk;
  }

  const absl::Span<const uint8_t> raw_;
  const uint32_t width_;
  const CodecOptions& options_;
  io::BufferPool* const pool_;
  ChunkHeader& header_;
  const bool shuffled_;
  const double keep_;      // the most of the raw size a coded chunk may keep
  io::AlignedBuffer out_;  // header, stored bytes, padding
};

}  // namespace

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
  header->version = options.format_version;
  header->stored_offset = kChunkHeaderSize;
  header->element_width = element_width;
  header->raw_size = static_cast<uint32_t>(raw.size());
  header->raw_xxh3 = raw_xxh3.has_value() ? *raw_xxh3 : Checksum(raw);
  header->codec = proto::CODEC_NONE;
  header->filter = proto::FILTER_NONE;
  ChunkEncoder encoder(raw, element_width, options, pool, header);
  RETURN_IF_ERROR(encoder.Compress());
  if (header->codec == proto::CODEC_NONE) {
    if (std::optional<EncodedChunk> in_place = encoder.StoreRaw()) {
      return *std::move(in_place);
    }
  }
  return encoder.Finish();
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

void XorInto(absl::Span<uint8_t> dst, absl::Span<const uint8_t> src) {
  // Word by word; the compiler vectorizes it.
  size_t i = 0;
  for (; i + 8 <= dst.size(); i += 8) {
    uint64_t a, b;
    std::memcpy(&a, dst.data() + i, 8);
    std::memcpy(&b, src.data() + i, 8);
    a ^= b;
    std::memcpy(dst.data() + i, &a, 8);
  }
  for (; i < dst.size(); ++i) dst[i] ^= src[i];
}

}  // namespace ckpt::snapshot
