// A shard as one self-contained file. An incremental shard (format 3) stores
// unchanged chunks in base shards beside it; what leaves the node (a peer's
// replica, the shared tier, a shard streamed to a restore elsewhere) must
// stand alone. OpenSelfContained presents such a shard as a read-only file in
// which every chunk is stored: each chunk's bytes read verbatim from the file
// that holds them (its header and checksums unchanged), the manifest rewritten
// with the chunks back to back and no bases, and a new footer. A chunk stored
// as an XOR delta (format 5) depends on other shards' bytes: it is decoded
// through them when read and stored whole, raw (CODEC_NONE). A shard with no
// bases is its own file. Readers and receivers check it like any shard file.
//
// Thread-safety: a view is used by one thread at a time.
#ifndef CKPT_SNAPSHOT_SELF_CONTAINED_H_
#define CKPT_SNAPSHOT_SELF_CONTAINED_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "io/file_system.h"
#include "proto/manifest.pb.h"

namespace ckpt::snapshot {

struct SelfContained {
  std::unique_ptr<io::ReadableFile> file;
  uint64_t size = 0;
  // The manifest the file holds, serialized (what a stream's offer carries).
  std::string manifest_bytes;
  // The shard stores chunks in base shards (the file is a view).
  bool incremental = false;
};

// Opens the shard at `path` (and its bases, checked to be the files it names)
// as a self-contained file. Errors name the shard and the base.
absl::StatusOr<SelfContained> OpenSelfContained(io::FileSystem* fs,
                                                const std::string& path);

// The shard at `path` as it goes to a receiver: its own file, as it is, when
// it is an increment every base of which `has_base` says the receiver holds
// as the very file named (`as_is` set: only the chunks it stores travel);
// else its self-contained form (OpenSelfContained).
absl::StatusOr<SelfContained> OpenForReceiver(
    io::FileSystem* fs, const std::string& path,
    const std::function<bool(const proto::BaseShard&)>& has_base, bool* as_is);

// Writes a view's bytes to `path` (created, or truncated) and syncs the file;
// the caller renames it into place.
absl::Status WriteSelfContained(io::FileSystem* fs, SelfContained& view,
                                const std::string& path);

// The shard at `path` rewritten in place as its self-contained form (written
// beside it, synced, renamed over it, the directory synced; or, on a store
// whose files appear whole when closed, an object store, written over it
// directly): it no longer reads its bases. What the new file is:
struct Detached {
  uint64_t size = 0;
  uint64_t manifest_xxh3 = 0;
  std::string manifest_bytes;
};
absl::StatusOr<Detached> MakeSelfContained(io::FileSystem* fs,
                                           const std::string& path,
                                           bool writes_appear_whole = false);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_SELF_CONTAINED_H_
