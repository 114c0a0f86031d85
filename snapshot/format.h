// The fixed-layout parts of a shard file (snapshot/FORMAT.md): the 64-byte
// chunk header that starts every chunk and the 64-byte footer that ends the
// file, plus the structural checks a reader applies to a manifest before
// trusting any size or offset in it.
//
// Thread-safety: constants and pure functions, callable from any thread.
#ifndef CKPT_SNAPSHOT_FORMAT_H_
#define CKPT_SNAPSHOT_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/manifest.pb.h"

namespace ckpt::snapshot {

// What writers write; readers also read every version from
// kOldestFormatVersion on.
inline constexpr uint32_t kFormatVersion = 5;
inline constexpr uint32_t kOldestFormatVersion = 1;
// The first versions with chunks stored in base shards (incremental saves),
// with byte-plane coded chunks (CODEC_ZSTD_PLANES) and with XOR deltas.
inline constexpr uint32_t kIncrementalFormatVersion = 3;
inline constexpr uint32_t kPlanesFormatVersion = 4;
inline constexpr uint32_t kDeltaFormatVersion = 5;
// The oldest version a writer may be asked to write (ckptd --shard-format), so
// that nodes not yet upgraded read what upgraded ones write.
inline constexpr uint32_t kOldestWrittenFormatVersion = 3;
inline constexpr uint32_t kAlignment = 4096;
inline constexpr size_t kChunkHeaderSize = 64;
inline constexpr size_t kFooterSize = 64;
inline constexpr uint32_t kDefaultChunkSize = 4u << 20;
inline constexpr uint32_t kMaxChunkSize = 64u << 20;
inline constexpr uint64_t kMaxManifestSize = 256u << 20;
// The chunks an item of `bytes` is cut into (the last may be shorter); 0 when
// `chunk_size` is 0.
inline constexpr uint64_t ChunkCount(uint64_t bytes, uint32_t chunk_size) {
  return chunk_size == 0 ? 0 : (bytes + chunk_size - 1) / chunk_size;
}
inline constexpr char kChunkMagic[4] = {'C', 'K', 'C', 'H'};
inline constexpr char kFooterMagic[8] = {'C', 'K', 'P', 'T',
                                         'S', 'H', 'R', 'D'};
// The file name suffix of a committed shard, and of one being written.
inline constexpr char kShardSuffix[] = ".shard";
inline constexpr char kTempSuffix[] = ".tmp";

// What the header in front of every chunk's stored bytes says. It repeats the
// manifest's ChunkInfo so a chunk can be checked (and shipped to a peer) on its
// own.
struct ChunkHeader {
  // The header layout's version: the file's format version.
  uint32_t version = kFormatVersion;
  // Where the stored bytes start, counted from the chunk's first byte: right
  // after the header (kChunkHeaderSize), or, from format 2 on, at the next
  // alignment boundary (kAlignment), which lets a writer send raw bytes to
  // O_DIRECT from where they lie in memory.
  uint32_t stored_offset = kChunkHeaderSize;
  proto::Codec codec = proto::CODEC_NONE;
  proto::Filter filter = proto::FILTER_NONE;
  uint32_t element_width = 1;
  uint32_t item_index = 0;
  uint32_t chunk_index = 0;
  uint32_t raw_size = 0;
  uint32_t stored_size = 0;
  uint64_t raw_offset = 0;
  // The raw bytes' checksum; for an XOR delta, the decoded delta's.
  uint64_t raw_xxh3 = 0;
  uint64_t stored_xxh3 = 0;
  // Format 5: the stored bytes decode to an XOR delta (flags byte, bit 0).
  bool xor_delta = false;
};

// The file name of rank `rank`'s shard of step `step`: the step in 20 digits,
// '-', the rank in 10 digits, then `suffix` (".shard" on disk, ".ckpt" for
// peer and shared copies). Shards that share chunks lie side by side under
// such names.
std::string ShardFileName(uint64_t step, uint32_t rank,
                          absl::string_view suffix);
// The name of a step's commit marker on the shared tier, beside its copies:
// the step in 20 digits, then ".commit" (the marker holds the CommitRecord).
std::string CommitMarkerName(uint64_t step);
// The path of the same rank's shard of `step` beside the shard at `path`
// (named by ShardFileName): its base shard. An error when `path`'s file name
// is not such a name.
absl::StatusOr<std::string> SiblingShardPath(absl::string_view path,
                                             uint64_t step);

void EncodeChunkHeader(const ChunkHeader& header,
                       uint8_t out[kChunkHeaderSize]);
// Checks magic, version, reserved bytes and the header checksum.
absl::StatusOr<ChunkHeader> DecodeChunkHeader(absl::Span<const uint8_t> bytes);

struct Footer {
  uint32_t version = kFormatVersion;
  uint64_t manifest_offset = 0;
  uint64_t manifest_size = 0;
  uint64_t manifest_xxh3 = 0;
  uint64_t file_size = 0;
};

void EncodeFooter(const Footer& footer, uint8_t out[kFooterSize]);
absl::StatusOr<Footer> DecodeFooter(absl::Span<const uint8_t> bytes);

// Bytes a chunk occupies in the file: header, zero padding up to
// `stored_offset`, stored bytes, zero padding to kAlignment.
inline uint64_t ChunkFootprint(uint64_t stored_offset, uint64_t stored_size) {
  return (stored_offset + stored_size + kAlignment - 1) / kAlignment *
         kAlignment;
}
// A manifest chunk's stored offset (format 1 manifests leave it unset).
inline uint32_t StoredOffset(const proto::ChunkInfo& chunk) {
  return chunk.stored_offset() == 0 ? static_cast<uint32_t>(kChunkHeaderSize)
                                    : chunk.stored_offset();
}

// OK when writers may write `version` (kOldestWrittenFormatVersion to
// kFormatVersion); else InvalidArgument naming it.
absl::Status CheckWrittenFormat(uint32_t version);

// Checks that a manifest is self-consistent and fits a file of `file_size`
// bytes whose manifest starts at `manifest_offset`: version, names (valid,
// unique), dtypes, shapes and boxes, item sizes, chunk tiling of both the raw
// bytes and the file, codecs and stored-size bounds. After it passes, every
// size and offset in the manifest is safe to allocate and read.
absl::Status ValidateManifest(const proto::ShardManifest& manifest,
                              uint64_t manifest_offset);

// The raw size a tensor item must have: product of box lengths times the
// element width.
absl::StatusOr<uint64_t> TensorByteSize(const proto::Item& item);
// Checks a tensor item's dtype, and that its box has one offset and length per
// dimension of its shape and lies inside it; returns its byte size.
// InvalidArgument errors name the tensor. Writer, reader, daemon and client all
// use this one check.
absl::StatusOr<uint64_t> ValidateTensorBox(const proto::Item& item);

// The header a manifest's chunk entry implies in a file of `version`, to
// compare with the one in the file.
ChunkHeader HeaderFor(const proto::ChunkInfo& chunk, uint32_t item_index,
                      uint32_t chunk_index, uint32_t version);
bool operator==(const ChunkHeader& a, const ChunkHeader& b);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_FORMAT_H_
