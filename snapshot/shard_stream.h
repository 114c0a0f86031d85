// Reading a shard file that arrives as a stream, front to back (a peer's bulk
// transfer), straight into the memory its items go to: no landing copy of the
// file. The manifest is known first (the sender reads it from its copy's tail
// and sends it with the offer); the chunks then arrive in file order and each
// is checked as it lands: its header against the manifest, its checksums, its
// zero padding. The stream's own tail (manifest and footer) must match the
// manifest the routing used, so a wrong manifest is caught, only late: by then
// the destinations may hold garbage, and a failed read leaves them undefined.
//
//   ASSIGN_OR_RETURN(proto::ShardManifest m, ParseStreamManifest(bytes, size));
//   ... one destination per item of m, each exactly its raw size ...
//   RETURN_IF_ERROR(ReadShardStream(read_exactly, size, m, bytes, dst));
//
// Thread-safety: the functions are thread-safe.
#ifndef CKPT_SNAPSHOT_SHARD_STREAM_H_
#define CKPT_SNAPSHOT_SHARD_STREAM_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "io/thread_pool.h"
#include "proto/manifest.pb.h"

namespace ckpt::snapshot {

// Parses and validates (ValidateManifest) the serialized manifest of a shard
// file of `file_size` bytes.
absl::StatusOr<proto::ShardManifest> ParseStreamManifest(
    const std::string& manifest_bytes, uint64_t file_size);

// Fills exactly `out.size()` bytes with the next bytes of the stream.
using StreamRead = std::function<absl::Status(absl::Span<uint8_t> out)>;

// Reads the whole file of `file_size` bytes from `read` and writes each
// item's raw bytes to `items[i]` (one per manifest item, each exactly the
// item's raw size). `manifest` is ParseStreamManifest's result for
// `manifest_bytes`. Compressed chunks are decoded on `pool` (when given)
// while the next ones arrive; uncompressed ones land in place as they arrive.
absl::Status ReadShardStream(const StreamRead& read, uint64_t file_size,
                             const proto::ShardManifest& manifest,
                             const std::string& manifest_bytes,
                             const std::vector<absl::Span<uint8_t>>& items,
                             io::ThreadPool* pool = nullptr);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_SHARD_STREAM_H_
