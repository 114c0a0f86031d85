#include "snapshot/format.h"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "io/status_macros.h"
#include "snapshot/dtype.h"
#include "snapshot/names.h"
#include "snapshot/plane_codec.h"
#include "snapshot/xxh3.h"

namespace ckpt::snapshot {

std::string ShardFileName(uint64_t step, uint32_t rank,
                          absl::string_view suffix) {
  char name[40];
  std::snprintf(name, sizeof name, "%020" PRIu64 "-%010" PRIu32, step, rank);
  return absl::StrCat(name, suffix);
}

std::string CommitMarkerName(uint64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "%020" PRIu64 ".commit", step);
  return name;
}

absl::StatusOr<std::string> SiblingShardPath(absl::string_view path,
                                             uint64_t step) {
  const size_t slash = path.rfind('/');
  const size_t start = slash == absl::string_view::npos ? 0 : slash + 1;
  absl::string_view name = path.substr(start);
  constexpr size_t kStepDigits = 20;
  const bool named = name.size() > kStepDigits + 11 &&
                     name[kStepDigits] == '-' &&
                     std::all_of(name.begin(), name.begin() + kStepDigits,
                                 [](char c) { return c >= '0' && c <= '9'; });
  if (!named) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard file name \"", name,
                     "\" is not <step>-<rank><suffix>: its base shards cannot "
                     "be found"));
  }
  char digits[kStepDigits + 1];
  std::snprintf(digits, sizeof digits, "%020" PRIu64, step);
  return absl::StrCat(path.substr(0, start), digits, name.substr(kStepDigits));
}
namespace {

// The format is little-endian; so is every machine ckpt runs on.
static_assert(std::endian::native == std::endian::little,
              "ckpt assumes a little-endian host");
template <typename T>
void Put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(v));
}
template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
void Put16(uint8_t* p, uint16_t v) { Put(p, v); }
void Put32(uint8_t* p, uint32_t v) { Put(p, v); }
void Put64(uint8_t* p, uint64_t v) { Put(p, v); }
uint16_t Get16(const uint8_t* p) { return Get<uint16_t>(p); }
uint32_t Get32(const uint8_t* p) { return Get<uint32_t>(p); }
uint64_t Get64(const uint8_t* p) { return Get<uint64_t>(p); }

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

bool KnownCodec(proto::Codec c, uint32_t version) {
  return c == proto::CODEC_NONE || c == proto::CODEC_ZSTD ||
         (c == proto::CODEC_ZSTD_PLANES && version >= kPlanesFormatVersion);
}
bool KnownFilter(proto::Filter f) {
  return f == proto::FILTER_NONE || f == proto::FILTER_BYTE_SHUFFLE;
}

}  // namespace

// Layout (little-endian): magic[4] version u16 codec u8 filter u8 | width u8
// flags u8 (version 5: bit 0, an XOR delta; else zero) reserved[2] item u32
// chunk u32 | raw_size u32 stored_size u32 stored_offset u32 (version 2; zero
// in version 1) | raw_offset u64 raw_xxh3 u64 stored_xxh3 u64 | header_xxh3 u64
// (of bytes 0..55).
void EncodeChunkHeader(const ChunkHeader& h, uint8_t out[kChunkHeaderSize]) {
  std::memset(out, 0, kChunkHeaderSize);
  std::memcpy(out, kChunkMagic, 4);
  Put16(out + 4, static_cast<uint16_t>(h.version));
  out[6] = static_cast<uint8_t>(h.codec);
  out[7] = static_cast<uint8_t>(h.filter);
  out[8] = static_cast<uint8_t>(h.element_width);
  out[9] = h.xor_delta ? 1 : 0;
  Put32(out + 12, h.item_index);
  Put32(out + 16, h.chunk_index);
  Put32(out + 20, h.raw_size);
  Put32(out + 24, h.stored_size);
  if (h.version >= 2) Put32(out + 28, h.stored_offset);
  Put64(out + 32, h.raw_offset);
  Put64(out + 40, h.raw_xxh3);
  Put64(out + 48, h.stored_xxh3);
  Put64(out + 56, XXH3_64bits(out, 56));
}

absl::Status CheckWrittenFormat(uint32_t version) {
  if (version >= kOldestWrittenFormatVersion && version <= kFormatVersion)
    return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("shard format ", version, ": writers write ",
                   kOldestWrittenFormatVersion, " to ", kFormatVersion));
}

absl::StatusOr<ChunkHeader> DecodeChunkHeader(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kChunkHeaderSize) {
    return absl::DataLossError(
        absl::StrCat("chunk header truncated to ", bytes.size(), " bytes"));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kChunkMagic, 4) != 0)
    return absl::DataLossError("chunk header: bad magic");
  if (Get64(p + 56) != XXH3_64bits(p, 56)) {
    return absl::DataLossError("chunk header: checksum mismatch");
  }
  const uint16_t version = Get16(p + 4);
  if (version < kOldestFormatVersion || version > kFormatVersion) {
    return absl::DataLossError(
        absl::StrCat("chunk header: unsupported version ", version));
  }
  const uint8_t flags_allowed = version >= kDeltaFormatVersion ? 1 : 0;
  if ((p[9] & ~flags_allowed) != 0 || !AllZero(p + 10, 2) ||
      (version == 1 && !AllZero(p + 28, 4))) {
    return absl::DataLossError("chunk header: reserved bytes are not zero");
  }
  ChunkHeader h;
  h.version = version;
  h.xor_delta = (p[9] & 1) != 0;
  if (version >= 2) {
    h.stored_offset = Get32(p + 28);
    if (h.stored_offset != kChunkHeaderSize && h.stored_offset != kAlignment) {
      return absl::DataLossError(absl::StrCat(
          "chunk header: stored bytes at offset ", h.stored_offset,
          " (expected ", kChunkHeaderSize, " or ", kAlignment, ")"));
    }
  }
  h.codec = static_cast<proto::Codec>(p[6]);
  h.filter = static_cast<proto::Filter>(p[7]);
  h.element_width = p[8];
  h.item_index = Get32(p + 12);
  h.chunk_index = Get32(p + 16);
  h.raw_size = Get32(p + 20);
  h.stored_size = Get32(p + 24);
  h.raw_offset = Get64(p + 32);
  h.raw_xxh3 = Get64(p + 40);
  h.stored_xxh3 = Get64(p + 48);
  return h;
}

// Layout (little-endian): magic[8] version u32 flags u32 manifest_offset u64
// manifest_size u64 manifest_xxh3 u64 file_size u64 reserved u64 footer_xxh3
// u64 (of bytes 0..55).
void EncodeFooter(const Footer& f, uint8_t out[kFooterSize]) {
  std::memset(out, 0, kFooterSize);
  std::memcpy(out, kFooterMagic, 8);
  Put32(out + 8, f.version);
  Put64(out + 16, f.manifest_offset);
  Put64(out + 24, f.manifest_size);
  Put64(out + 32, f.manifest_xxh3);
  Put64(out + 40, f.file_size);
  Put64(out + 56, XXH3_64bits(out, 56));
}

absl::StatusOr<Footer> DecodeFooter(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != kFooterSize) {
    return absl::DataLossError(absl::StrCat("footer is ", bytes.size(),
                                            " bytes, expected ", kFooterSize));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kFooterMagic, 8) != 0) {
    return absl::DataLossError(
        "footer: bad magic (not a ckpt shard file, or truncated)");
  }
  if (Get64(p + 56) != XXH3_64bits(p, 56))
    return absl::DataLossError("footer: checksum mismatch");
  uint32_t version = Get32(p + 8);
  if (version < kOldestFormatVersion || version > kFormatVersion) {
    return absl::DataLossError(
        absl::StrCat("footer: format version ", version,
                     " is not supported (this reader knows ",
                     kOldestFormatVersion, " to ", kFormatVersion, ")"));
  }
  if (Get32(p + 12) != 0 || Get64(p + 48) != 0) {
    return absl::DataLossError("footer: reserved bytes are not zero");
  }
  Footer f;
  f.version = version;
  f.manifest_offset = Get64(p + 16);
  f.manifest_size = Get64(p + 24);
  f.manifest_xxh3 = Get64(p + 32);
  f.file_size = Get64(p + 40);
  return f;
}

absl::StatusOr<uint64_t> TensorByteSize(const proto::Item& item) {
  uint64_t width = DTypeSize(item.dtype());
  if (width == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", item.name(), "\" has dtype ", DTypeName(item.dtype())));
  }
  uint64_t n = width;
  for (int64_t len : item.box_length()) {
    if (len < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", item.name(), "\" has a negative box length"));
    }
    if (len != 0 && n > UINT64_MAX / static_cast<uint64_t>(len)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", item.name(), "\" is too large (size overflows)"));
    }
    n *= static_cast<uint64_t>(len);
  }
  return n;
}

absl::StatusOr<uint64_t> ValidateTensorBox(const proto::Item& item) {
  if (DTypeSize(item.dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", item.name(), "\": dtype ",
                     DTypeName(item.dtype()), " is not storable"));
  }
  const int rank = item.global_shape_size();
  if (item.box_offset_size() != rank || item.box_length_size() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", item.name(), "\" has ", rank,
                     " dims but its box has ", item.box_offset_size(),
                     " offsets and ", item.box_length_size(), " lengths"));
  }
  for (int d = 0; d < rank; ++d) {
    int64_t dim = item.global_shape(d), off = item.box_offset(d),
            len = item.box_length(d);
    if (dim < 0 || off < 0 || len < 0 || off > dim || len > dim - off) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", item.name(), "\" dim ", d, ": box [", off,
                       ", +", len, ") is outside [0, ", dim, ")"));
    }
  }
  return TensorByteSize(item);
}

ChunkHeader HeaderFor(const proto::ChunkInfo& c, uint32_t item_index,
                      uint32_t chunk_index, uint32_t version) {
  ChunkHeader h;
  h.version = version;
  h.stored_offset = StoredOffset(c);
  h.codec = c.codec();
  h.filter = c.filter();
  h.element_width = c.element_width();
  h.item_index = item_index;
  h.chunk_index = chunk_index;
  h.raw_size = c.raw_size();
  h.stored_size = c.stored_size();
  h.raw_offset = c.raw_offset();
  h.raw_xxh3 = c.xor_base() > 0 ? c.delta_xxh3() : c.raw_xxh3();
  h.stored_xxh3 = c.stored_xxh3();
  h.xor_delta = c.xor_base() > 0;
  return h;
}

bool operator==(const ChunkHeader& a, const ChunkHeader& b) {
  return a.version == b.version && a.stored_offset == b.stored_offset &&
         a.codec == b.codec && a.filter == b.filter &&
         a.element_width == b.element_width && a.item_index == b.item_index &&
         a.chunk_index == b.chunk_index && a.raw_size == b.raw_size &&
         a.stored_size == b.stored_size && a.raw_offset == b.raw_offset &&
         a.raw_xxh3 == b.raw_xxh3 && a.stored_xxh3 == b.stored_xxh3 &&
         a.xor_delta == b.xor_delta;
}

namespace {

template <typename... Parts>
absl::Status Bad(const Parts&... parts) {
  return absl::DataLossError(absl::StrCat("manifest: ", parts...));
}

// Version, rank, alignment, chunk size and where the data ends.
absl::Status ValidateShardFields(const proto::ShardManifest& m,
                                 uint64_t manifest_offset) {
  if (m.format_version() < kOldestFormatVersion ||
      m.format_version() > kFormatVersion) {
    return Bad("format version ", m.format_version(), " is not supported");
  }
  if (!m.job().empty()) RETURN_IF_ERROR(ValidateJobId(m.job()));
  if (m.world_size() == 0 || m.rank() >= m.world_size()) {
    return Bad("rank ", m.rank(), " is outside world size ", m.world_size());
  }
  if (m.alignment() != kAlignment) return Bad("alignment ", m.alignment());
  if (m.chunk_size() == 0 || m.chunk_size() > kMaxChunkSize ||
      m.chunk_size() % 8 != 0) {
    return Bad("chunk size ", m.chunk_size(), " is outside (0, ", kMaxChunkSize,
               "] or not a multiple of 8");
  }
  if (m.data_size() != manifest_offset) {
    return Bad("data size ", m.data_size(), " does not match manifest offset ",
               manifest_offset);
  }
  return absl::OkStatus();
}

// Base shards: only in an incremental format, with increments counted, each
// an earlier step named once.
absl::Status ValidateBases(const proto::ShardManifest& m) {
  if (m.format_version() < kIncrementalFormatVersion &&
      (m.bases_size() > 0 || m.increments() > 0)) {
    return Bad("base shards in format ", m.format_version());
  }
  if ((m.bases_size() > 0) != (m.increments() > 0)) {
    return Bad(m.bases_size(), " base shards but ", m.increments(),
               " increments since a full save");
  }
  std::set<uint64_t> base_steps;
  for (const proto::BaseShard& b : m.bases()) {
    if (b.step() >= m.step() || !base_steps.insert(b.step()).second) {
      return Bad("base shard step ", b.step(),
                 " is not an earlier step named once (this is step ", m.step(),
                 ")");
    }
  }
  return absl::OkStatus();
}

// The item's kind and box; returns its element width.
absl::StatusOr<uint32_t> ValidateItemKind(const proto::Item& item) {
  if (item.kind() == proto::ITEM_KIND_TENSOR) {
    absl::StatusOr<uint64_t> size = ValidateTensorBox(item);
    if (!size.ok()) return Bad(size.status().message());
    if (*size != item.raw_size()) {
      return Bad("tensor \"", item.name(), "\" raw size ", item.raw_size(),
                 " does not match its box (", *size, " bytes)");
    }
    return static_cast<uint32_t>(DTypeSize(item.dtype()));
  }
  if (item.kind() == proto::ITEM_KIND_BYTES) {
    if (item.dtype() != proto::DTYPE_UNSPECIFIED ||
        item.global_shape_size() != 0 || item.box_offset_size() != 0 ||
        item.box_length_size() != 0) {
      return Bad("byte item \"", item.name(), "\" has a dtype or shape");
    }
    return 1u;
  }
  return Bad("item \"", item.name(), "\" has unknown kind ", item.kind());
}

// How a chunk's bytes are coded: a known codec and filter, byte planes with
// their filter and width, the element width of its item, stored sizes a
// coder could produce.
absl::Status ValidateCoding(const proto::ChunkInfo& chunk, uint32_t version,
                            uint32_t width) {
  if (!KnownCodec(chunk.codec(), version) || !KnownFilter(chunk.filter())) {
    return absl::DataLossError(absl::StrCat("unknown codec ", chunk.codec(),
                                            " or filter ", chunk.filter(),
                                            " in format ", version));
  }
  if (chunk.codec() == proto::CODEC_ZSTD_PLANES &&
      (chunk.filter() != proto::FILTER_BYTE_SHUFFLE ||
       chunk.element_width() < kMinPlaneWidth ||
       chunk.element_width() > kMaxPlaneWidth)) {
    return absl::DataLossError(absl::StrCat(
        "byte planes need the byte-shuffle filter and ", kMinPlaneWidth, " to ",
        kMaxPlaneWidth, "-byte elements (filter ", chunk.filter(), ", width ",
        chunk.element_width(), ")"));
  }
  if (chunk.element_width() != width) {
    return absl::DataLossError(absl::StrCat(
        "element width ", chunk.element_width(), ", expected ", width));
  }
  if (chunk.codec() == proto::CODEC_NONE &&
      chunk.stored_size() != chunk.raw_size()) {
    return absl::DataLossError(absl::StrCat("uncompressed but stored size ",
                                            chunk.stored_size(),
                                            " != raw size ", chunk.raw_size()));
  }
  // zstd never needs more than its bound; anything larger is a lie.
  const uint64_t bound = chunk.raw_size() + chunk.raw_size() / 128 + 1024;
  if (chunk.stored_size() == 0 || chunk.stored_size() > bound) {
    return absl::DataLossError(absl::StrCat("stored size ", chunk.stored_size(),
                                            " is implausible for raw size ",
                                            chunk.raw_size()));
  }
  return absl::OkStatus();
}

// An XOR delta: only in format 5, against one of the manifest's bases.
absl::Status ValidateDelta(const proto::ShardManifest& m,
                           const proto::ChunkInfo& chunk) {
  if (chunk.xor_base() == 0) {
    if (chunk.delta_xxh3() != 0 || chunk.xor_depth() != 0)
      return absl::DataLossError(
          "a delta checksum or depth on a chunk that is no delta");
    return absl::OkStatus();
  }
  if (chunk.xor_depth() == 0 || chunk.xor_depth() > m.increments()) {
    return absl::DataLossError(
        absl::StrCat("XOR delta depth ", chunk.xor_depth(), " outside [1, ",
                     m.increments(), "] (the increments since a full save)"));
  }
  if (m.format_version() < kDeltaFormatVersion) {
    return absl::DataLossError(
        absl::StrCat("an XOR delta in format ", m.format_version()));
  }
  if (chunk.xor_base() > static_cast<uint32_t>(m.bases_size())) {
    return absl::DataLossError(
        absl::StrCat("XOR delta against base ", chunk.xor_base(),
                     " but the manifest has ", m.bases_size(), " base shards"));
  }
  return absl::OkStatus();
}

// Where a chunk lies: in this file at `file_pos`, or aligned in a base; its
// stored offset valid in the format.
absl::Status ValidatePlacement(const proto::ShardManifest& m,
                               const proto::ChunkInfo& chunk,
                               uint64_t file_pos) {
  if (chunk.base() > static_cast<uint32_t>(m.bases_size())) {
    return absl::DataLossError(absl::StrCat("base ", chunk.base(),
                                            " but the manifest has ",
                                            m.bases_size(), " base shards"));
  }
  if (chunk.base() > 0 ? chunk.file_offset() % kAlignment != 0
                       : chunk.file_offset() != file_pos) {
    return absl::DataLossError(
        absl::StrCat("file offset ", chunk.file_offset(),
                     chunk.base() > 0 ? " in its base is not aligned"
                                      : absl::StrCat(", expected ", file_pos)));
  }
  const uint32_t stored_offset = chunk.stored_offset();
  if (m.format_version() == 1
          ? stored_offset != 0
          : stored_offset != kChunkHeaderSize && stored_offset != kAlignment) {
    return absl::DataLossError(absl::StrCat("stored offset ", stored_offset,
                                            " is not valid in format ",
                                            m.format_version()));
  }
  if (stored_offset == kAlignment && chunk.codec() != proto::CODEC_NONE) {
    return absl::DataLossError("a compressed chunk stored at the alignment");
  }
  return ValidateDelta(m, chunk);
}

// Chunk `c` of an item, the next `raw_pos` bytes of it.
absl::Status ValidateChunk(const proto::ShardManifest& m,
                           const proto::Item& item, int c, uint32_t width,
                           uint64_t raw_pos, uint64_t file_pos) {
  const proto::ChunkInfo& chunk = item.chunks(c);
  if (chunk.raw_offset() != raw_pos) {
    return absl::DataLossError(absl::StrCat("raw offset ", chunk.raw_offset(),
                                            ", expected ", raw_pos));
  }
  if (chunk.raw_size() == 0 || chunk.raw_size() > m.chunk_size()) {
    return absl::DataLossError(absl::StrCat(
        "raw size ", chunk.raw_size(), " outside (0, ", m.chunk_size(), "]"));
  }
  if (c + 1 < item.chunks_size() && chunk.raw_size() != m.chunk_size()) {
    return absl::DataLossError(
        "only the last chunk may be smaller than the chunk size");
  }
  RETURN_IF_ERROR(ValidateCoding(chunk, m.format_version(), width));
  return ValidatePlacement(m, chunk, file_pos);
}

// Item `i`: its name, kind and chunks, which cover it in order; advances
// `file_pos` past the chunks stored in this file.
absl::Status ValidateItem(const proto::ShardManifest& m, int i,
                          std::set<std::string>* names, uint64_t* file_pos) {
  const proto::Item& item = m.items(i);
  absl::Status name_ok = ValidateItemName(item.name());
  if (!name_ok.ok()) return Bad("item ", i, ": ", name_ok.message());
  if (!names->insert(item.name()).second) {
    return Bad("item name \"", item.name(), "\" appears twice");
  }
  ASSIGN_OR_RETURN(const uint32_t width, ValidateItemKind(item));
  uint64_t raw_pos = 0;
  for (int c = 0; c < item.chunks_size(); ++c) {
    const proto::ChunkInfo& chunk = item.chunks(c);
    absl::Status ok = ValidateChunk(m, item, c, width, raw_pos, *file_pos);
    if (!ok.ok()) {
      return Bad("item \"", item.name(), "\" chunk ", c, ": ", ok.message());
    }
    if (chunk.base() == 0) {
      *file_pos += ChunkFootprint(StoredOffset(chunk), chunk.stored_size());
    }
    raw_pos += chunk.raw_size();
  }
  if (raw_pos != item.raw_size()) {
    return Bad("item \"", item.name(), "\" chunks cover ", raw_pos, " of ",
               item.raw_size(), " bytes");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateManifest(const proto::ShardManifest& m,
                              uint64_t manifest_offset) {
  RETURN_IF_ERROR(ValidateShardFields(m, manifest_offset));
  RETURN_IF_ERROR(ValidateBases(m));
  std::set<std::string> names;
  uint64_t file_pos = 0;
  for (int i = 0; i < m.items_size(); ++i) {
    RETURN_IF_ERROR(ValidateItem(m, i, &names, &file_pos));
  }
  if (file_pos != m.data_size()) {
    return Bad("chunks end at ", file_pos, " but data size is ", m.data_size());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::snapshot
