// ShardWriter writes one shard file: the chunks of every registered item,
// encoded in parallel (filter, zstd, checksums) and written in order through
// io::FileSystem (io_uring, O_DIRECT), then the manifest and footer. Commit()
// is write-temp, fsync, rename, fsync-directory: until it returns OK nothing is
// visible under the final name, and if it fails the old file of that name (if
// any) is untouched and the temporary file is removed when possible.
//
// Thread-safety: one thread drives a writer. Registered data must stay valid
// and unchanged until Commit() returns.
#ifndef CKPT_SNAPSHOT_SHARD_WRITER_H_
#define CKPT_SNAPSHOT_SHARD_WRITER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "io/file_system.h"
#include "io/thread_pool.h"
#include "proto/manifest.pb.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/chunk_pipeline.h"
#include "snapshot/codec_governor.h"
#include "snapshot/format.h"

namespace ckpt::snapshot {

// Who the shard belongs to; recorded in the manifest.
struct ShardInfo {
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
};

// A tensor shard to save: the box of a global tensor this rank holds,
// row-major.
struct TensorRef {
  std::string name;
  proto::DType dtype = proto::DTYPE_UNSPECIFIED;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> box_offset;
  std::vector<int64_t> box_length;
  absl::Span<const uint8_t> data;
  // XXH3-64 of each chunk_size run of `data` from its start, when known
  // already (a client hashed its staging slot once the copy was in it):
  // a chunk stored raw is then written without being read by a hash. Empty:
  // the writer hashes. Like `data`, must outlive Commit().
  absl::Span<const uint64_t> chunk_xxh3 = {};
};

// An earlier committed shard of the same job, rank and world size that this
// one may store its unchanged chunks in (an incremental save): a chunk whose
// item matches the base's item at the same position (name, kind, dtype,
// shape, box) and whose raw bytes hash (XXH3-64) to those of the base's chunk
// at the same index is recorded as stored where the base stores it, and not
// written. The new shard then depends on the base's file (and on the files it
// depends on) lying beside it.
//
// With `read_raw`, a changed chunk of floats may be stored as the XOR with the
// base's chunk at its place (format 5), when that is stored smaller:
// consecutive saves of training state share most sign, exponent and high
// mantissa bits. The base's bytes are checked against its chunk's raw checksum
// first; bytes that do not match give no delta.
struct ShardBase {
  proto::ShardManifest manifest;  // as the base's file holds it
  uint64_t manifest_xxh3 = 0;     // the base's footer manifest checksum
  // The base's raw bytes of a chunk (its staging slot still in memory, or its
  // file read back); called on encoding threads, several at once. Null: no
  // deltas.
  ReadBaseRaw read_raw;
};

struct ShardWriterOptions {
  uint32_t chunk_size = kDefaultChunkSize;
  CodecOptions codec;
  // Encoding threads when no pool is given.
  int encode_threads = 2;
  io::ThreadPool* pool = nullptr;
  bool direct_io = true;
  // A file to write the shard over instead of creating one: a retired shard
  // nothing references any more. It is renamed to the temporary name and its
  // blocks are reused (what Commit() does not overwrite is truncated away), so
  // the file system neither frees them nor allocates new ones. On ext4 mounted
  // with `discard`, freeing a large file discards its blocks inside a journal
  // commit, which stalls the writes of the shard being persisted beside it.
  // When the rename fails, the shard goes to a new file.
  std::string recycle_from;
  // Null: every chunk is stored in this shard.
  std::shared_ptr<const ShardBase> base;
  // Changed float chunks may be stored as XOR deltas (when the format and the
  // base allow), when that stores at least `min_delta_saving` of the chunk's
  // stored size less: each delta costs a restore from disk one more decode
  // of the chunk (the chain's), worth it only for a real saving.
  bool xor_deltas = true;
  double min_delta_saving = 0.1;
  // Deltas a read of a chunk may have to decode, at most: a chunk whose base
  // chunk is that deep already is stored as it is. Bounds what a restore
  // from disk reads and decodes per chunk (depth + 1 chunks).
  uint32_t max_delta_depth = 4;
  // Decides per chunk between compressing (codec.codec, at the level it
  // picks) and storing raw; the writer reports to it what each chunk cost end
  // to end. Null: every chunk is offered to the compressor at
  // codec.zstd_level.
  std::shared_ptr<CodecGovernor> governor;
  // When it turns true, Commit() stops before the next chunk, removes the
  // temporary file and returns Cancelled (a daemon stopping within its
  // timeout). Must outlive Commit().
  const std::atomic<bool>* cancel = nullptr;
  // Called on the committing thread after each chunk is queued for writing:
  // proof of progress for a watchdog.
  std::function<void()> on_chunk;
};

// What became of a shard's chunks.
struct ShardWriteStats {
  uint64_t compressed = 0;          // stored compressed
  uint64_t raw_chosen = 0;          // stored raw: the governor chose so
  uint64_t raw_incompressible = 0;  // stored raw: compressing did not pay
  uint64_t unchanged = 0;           // left in a base shard
  uint64_t deltas = 0;  // stored as the XOR with the base's chunk (compressed)
};

class ShardWriter {
 public:
  // `path` is the final name (by convention ending in ".shard").
  ShardWriter(io::FileSystem* fs, std::string path, ShardInfo info,
              ShardWriterOptions options);
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  absl::Status AddTensor(const TensorRef& tensor);
  // `chunk_xxh3` as in TensorRef.
  absl::Status AddBytes(absl::string_view name, absl::Span<const uint8_t> data,
                        absl::Span<const uint64_t> chunk_xxh3 = {});

  // Writes and commits the shard; returns its manifest. Call at most once.
  absl::StatusOr<proto::ShardManifest> Commit();
  // After Commit(): the footer's manifest checksum, the shard's identity as a
  // base of later shards.
  uint64_t manifest_xxh3() const { return manifest_xxh3_; }
  // After Commit().
  const ShardWriteStats& stats() const { return stats_; }

 private:
  absl::Status AddItem(proto::Item item, absl::Span<const uint8_t> data,
                       absl::Span<const uint64_t> chunk_xxh3);
  // Commit's steps: every chunk encoded and written in file order, recorded
  // in the manifest as stored or left unchanged in a base; the tail
  // (manifest and footer) written after them, returning the file's size.
  absl::Status WriteAll(io::WritableFile* file);
  std::vector<ChunkPipeline::Chunk> PlanChunks();
  void RecordUnchanged(uint32_t item_index, const proto::ChunkInfo& base_chunk);
  void RecordStored(const ChunkPipeline::Result& result, uint64_t file_offset);
  static absl::Status WriteChunk(io::WritableFile* file, uint64_t at,
                                 EncodedChunk encoded);
  absl::StatusOr<uint64_t> WriteTail(io::WritableFile* file,
                                     uint64_t data_size);
  // The index (from 1) in manifest_.bases of the file that stores a chunk the
  // base records in its bases[in_base - 1] (0: in the base's own file).
  uint32_t BaseIndex(uint32_t in_base);
  absl::Status Fail(absl::Status status);

  io::FileSystem* const fs_;
  const std::string path_;
  const std::string temp_path_;
  const ShardWriterOptions options_;
  proto::ShardManifest manifest_;
  std::unordered_set<std::string> names_;               // of manifest_'s items
  std::vector<absl::Span<const uint8_t>> data_;         // per item
  std::vector<absl::Span<const uint64_t>> known_xxh3_;  // per item
  bool committed_ = false;
  uint64_t manifest_xxh3_ = 0;
  ShardWriteStats stats_;
};

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_SHARD_WRITER_H_
