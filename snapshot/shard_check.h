// Checks of a shard file's framing shared by every reader: the footer, the
// manifest it points at, each chunk's header and padding (FORMAT.md), and
// CheckShardBytes, which checks a whole file held in memory (a copy just
// received from a peer or rebuilt from parity) in one pass without decoding
// any chunk: every byte of it is covered by the manifest's checksum, a chunk
// header compared with the manifest, a stored-bytes checksum, or zero padding.
#ifndef CKPT_SNAPSHOT_SHARD_CHECK_H_
#define CKPT_SNAPSHOT_SHARD_CHECK_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/manifest.pb.h"
#include "snapshot/format.h"

namespace ckpt::snapshot {

// The footer of a file of `file_size` bytes, from its last kAlignment bytes:
// its checksum, and that the manifest it points at fits the file.
absl::StatusOr<Footer> CheckFooter(absl::Span<const uint8_t> last_block,
                                   uint64_t file_size);

// The manifest, from the file's bytes from footer.manifest_offset to its end:
// its checksum, the zero padding after it, that it parses and is valid
// (ValidateManifest) and says the footer's format version.
absl::StatusOr<proto::ShardManifest> CheckManifest(
    absl::Span<const uint8_t> tail, const Footer& footer);

// The header of a chunk whose framing starts at `bytes` (its footprint is in
// memory), checked against the manifest's entry for chunk `chunk_index` of
// item `item_index` in a file of `version`, with the zero padding after the
// header and after the stored bytes.
absl::StatusOr<ChunkHeader> CheckChunkFrame(const proto::ChunkInfo& chunk,
                                            uint32_t item_index,
                                            uint32_t chunk_index,
                                            uint32_t version,
                                            const uint8_t* bytes);

// A shard file in memory: footer and manifest, and with `every_chunk` every
// chunk's framing and stored-bytes checksum, on up to `threads` threads (the
// calling one among them). Returns the manifest; DataLoss names what is wrong
// (the first bad chunk by item and index, and its file offset). A file that
// stores chunks in base shards (an increment) is refused unless
// `allow_bases`: then only its own chunks are checked here, and the caller
// checks that it has the bases.
absl::StatusOr<proto::ShardManifest> CheckShardBytes(
    absl::Span<const uint8_t> file, bool every_chunk, int threads = 1,
    bool allow_bases = false);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_SHARD_CHECK_H_
