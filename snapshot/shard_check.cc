#include "snapshot/shard_check.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"
#include "io/parallel.h"
#include "io/status_macros.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/manifest_seal.h"

namespace ckpt::snapshot {
namespace {

// The offset of the first non-zero byte of [begin, end), or -1.
int64_t FirstNonZero(const uint8_t* begin, const uint8_t* end) {
  const uint8_t* nonzero =
      std::find_if(begin, end, [](uint8_t b) { return b != 0; });
  return nonzero == end ? -1 : nonzero - begin;
}

// Chunk `c` of item `i` of a file in memory: its framing and stored bytes.
absl::Status CheckChunk(absl::Span<const uint8_t> file,
                        const proto::ShardManifest& manifest, uint32_t version,
                        int i, int c) {
  const proto::Item& item = manifest.items(i);
  const proto::ChunkInfo& chunk = item.chunks(c);
  // ValidateManifest: the chunk's footprint lies in the file.
  const uint8_t* bytes = file.data() + chunk.file_offset();
  absl::StatusOr<ChunkHeader> header =
      CheckChunkFrame(chunk, static_cast<uint32_t>(i), static_cast<uint32_t>(c),
                      version, bytes);
  absl::Status st = header.status();
  if (st.ok() && Checksum({bytes + header->stored_offset,
                           chunk.stored_size()}) != header->stored_xxh3) {
    st = absl::DataLossError("stored bytes checksum mismatch");
  }
  if (st.ok()) return st;
  return absl::DataLossError(
      absl::StrCat("item \"", item.name(), "\" chunk ", c, " at file offset ",
                   chunk.file_offset(), ": ", st.message()));
}

}  // namespace

absl::StatusOr<Footer> CheckFooter(absl::Span<const uint8_t> last_block,
                                   uint64_t file_size) {
  if (file_size < kAlignment || file_size % kAlignment != 0) {
    return absl::DataLossError(
        absl::StrCat("file size ", file_size, " is not a positive multiple of ",
                     kAlignment, " (truncated or not a shard)"));
  }
  if (last_block.size() != kAlignment) {
    return absl::InvalidArgumentError(
        absl::StrCat("footer: ", last_block.size(), " bytes given, not the ",
                     kAlignment, " at the end of the file"));
  }
  ASSIGN_OR_RETURN(Footer footer, DecodeFooter(last_block.subspan(
                                      kAlignment - kFooterSize, kFooterSize)));
  if (footer.file_size != file_size) {
    return absl::DataLossError(absl::StrCat("footer says the file has ",
                                            footer.file_size, " bytes, it has ",
                                            file_size));
  }
  if (footer.manifest_size > kMaxManifestSize ||
      footer.manifest_offset % kAlignment != 0 ||
      footer.manifest_offset > file_size ||
      file_size - footer.manifest_offset !=
          io::AlignUp(footer.manifest_size + kFooterSize)) {
    return absl::DataLossError(absl::StrCat(
        "footer: manifest at offset ", footer.manifest_offset, " of ",
        footer.manifest_size, " bytes does not fit the file"));
  }
  return footer;
}

absl::StatusOr<proto::ShardManifest> CheckManifest(
    absl::Span<const uint8_t> tail, const Footer& footer) {
  if (tail.size() != footer.file_size - footer.manifest_offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "manifest: ", tail.size(), " bytes given, the footer says ",
        footer.file_size - footer.manifest_offset));
  }
  const uint8_t* manifest_bytes = tail.data();
  if (Checksum({manifest_bytes, footer.manifest_size}) !=
      footer.manifest_xxh3) {
    return absl::DataLossError(absl::StrCat(
        "manifest at offset ", footer.manifest_offset, ": checksum mismatch"));
  }
  const int64_t pad = FirstNonZero(manifest_bytes + footer.manifest_size,
                                   tail.data() + tail.size() - kFooterSize);
  if (pad >= 0) {
    return absl::DataLossError(
        absl::StrCat("non-zero padding byte at offset ",
                     footer.manifest_offset + footer.manifest_size + pad,
                     " between manifest and footer"));
  }
  if (std::shared_ptr<const SealKeys> keys = InstalledSealKeys()) {
    absl::Status sealed = keys->Check(absl::string_view(
        reinterpret_cast<const char*>(manifest_bytes), footer.manifest_size));
    if (!sealed.ok()) {
      return absl::PermissionDeniedError(absl::StrCat("manifest at offset ",
                                                      footer.manifest_offset,
                                                      ": ", sealed.message()));
    }
  }
  proto::ShardManifest manifest;
  if (!manifest.ParseFromArray(manifest_bytes,
                               static_cast<int>(footer.manifest_size))) {
    return absl::DataLossError("manifest does not parse");
  }
  RETURN_IF_ERROR(ValidateManifest(manifest, footer.manifest_offset));
  if (manifest.format_version() != footer.version) {
    return absl::DataLossError(absl::StrCat("manifest says format ",
                                            manifest.format_version(),
                                            ", the footer ", footer.version));
  }
  return manifest;
}

absl::StatusOr<ChunkHeader> CheckChunkFrame(const proto::ChunkInfo& chunk,
                                            uint32_t item_index,
                                            uint32_t chunk_index,
                                            uint32_t version,
                                            const uint8_t* bytes) {
  ASSIGN_OR_RETURN(ChunkHeader header,
                   DecodeChunkHeader({bytes, kChunkHeaderSize}));
  if (!(header == HeaderFor(chunk, item_index, chunk_index, version))) {
    return absl::DataLossError("chunk header does not match the manifest");
  }
  const uint8_t* stored = bytes + header.stored_offset;
  const uint64_t footprint =
      ChunkFootprint(header.stored_offset, chunk.stored_size());
  // Zero padding after the header and after the stored bytes.
  for (auto [pad, pad_end] :
       {std::pair(bytes + kChunkHeaderSize, stored),
        std::pair(stored + chunk.stored_size(), bytes + footprint)}) {
    const int64_t at = FirstNonZero(pad, pad_end);
    if (at >= 0) {
      return absl::DataLossError(
          absl::StrCat("non-zero padding byte at file offset ",
                       chunk.file_offset() + (pad - bytes) + at));
    }
  }
  return header;
}

absl::StatusOr<proto::ShardManifest> CheckShardBytes(
    absl::Span<const uint8_t> file, bool every_chunk, int threads,
    bool allow_bases) {
  if (file.size() < kAlignment) {
    return CheckFooter({}, file.size()).status();  // names the size
  }
  ASSIGN_OR_RETURN(
      Footer footer,
      CheckFooter(file.subspan(file.size() - kAlignment), file.size()));
  ASSIGN_OR_RETURN(proto::ShardManifest manifest,
                   CheckManifest(file.subspan(footer.manifest_offset), footer));
  if (manifest.bases_size() > 0 && !allow_bases) {
    return absl::DataLossError(
        absl::StrCat("the file stores chunks in ", manifest.bases_size(),
                     " base shards: it is not self-contained"));
  }
  if (!every_chunk) return manifest;
  std::vector<std::pair<int, int>> chunks;  // (item, chunk), in file order
  for (int i = 0; i < manifest.items_size(); ++i) {
    for (int c = 0; c < manifest.items(i).chunks_size(); ++c) {
      if (manifest.items(i).chunks(c).base() == 0) chunks.emplace_back(i, c);
    }
  }
  std::vector<absl::Status> checked(chunks.size());
  io::ParallelFor(chunks.size(), threads, [&](size_t k) {
    checked[k] = CheckChunk(file, manifest, footer.version, chunks[k].first,
                            chunks[k].second);
  });
  for (absl::Status& s : checked) RETURN_IF_ERROR(s);
  return manifest;
}

}  // namespace ckpt::snapshot
