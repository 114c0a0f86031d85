// ShardReader opens a committed shard file and reads items back, verifying
// everything it touches: the footer and manifest checksums and structure on
// Open(), and for every chunk read its header (which must match the manifest),
// zero padding, stored and raw checksums. Chunks stored in base shards (an
// incremental save) are read from the bases' files, opened when first needed;
// each base must be the very file the manifest names (its footer's manifest
// checksum). A chunk stored as an XOR delta (format 5) is decoded, then XORed
// with the same chunk of the shard it is a delta against, read (and verified)
// through a reader of that shard, which resolves its own deltas; the result
// must match the chunk's raw checksum. Reads are queued through
// io::FileSystem (io_uring, O_DIRECT) a window at a time and decoded in
// parallel. Every error names the file, and where it applies the item, chunk
// and file offset.
//
// Thread-safety: one thread at a time.
#ifndef CKPT_SNAPSHOT_SHARD_READER_H_
#define CKPT_SNAPSHOT_SHARD_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "io/aligned_buffer.h"
#include "io/file_system.h"
#include "io/thread_pool.h"
#include "proto/manifest.pb.h"

namespace ckpt::snapshot {

struct ShardReaderOptions {
  bool direct_io = true;
  int decode_threads = 2;
  io::ThreadPool* pool = nullptr;
  // Bytes of chunks read but not yet decoded (at least two chunks): reads
  // run ahead of the decoders by this much. Each chunk is one read request;
  // keep it under the file system's queue depth (16) in chunks, so queueing
  // a read never waits for the disk. 16 MiB (four 4 MiB chunks) restored
  // faster than 8 MiB in `ckpt-bench codec`: 1130-1330 against 1020-1090
  // MiB/s.
  size_t read_window_bytes = 16 << 20;
  // Where the shard's base shards are (format 3: chunks an incremental save
  // left unchanged lie in earlier shards of the same rank). Default: beside the
  // shard, named by ShardFileName with the base's step (SiblingShardPath).
  std::function<absl::StatusOr<std::string>(uint64_t step)> base_path;
};

class ShardReader {
 public:
  static absl::StatusOr<std::unique_ptr<ShardReader>> Open(
      io::FileSystem* fs, const std::string& path,
      const ShardReaderOptions& options = {});
  ~ShardReader();

  const proto::ShardManifest& manifest() const { return manifest_; }
  // The manifest as the file stores it (verified).
  const std::string& manifest_bytes() const { return manifest_bytes_; }
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }

  absl::StatusOr<const proto::Item*> FindItem(absl::string_view name) const;
  // Reads the whole item; out.size() must equal its raw size.
  absl::Status ReadItem(absl::string_view name, absl::Span<uint8_t> out);
  // Reads whole items in one pass: the chunks of all of them are read and
  // decoded in one pipeline, which keeps the disk busy across items (a model
  // has many small tensors). Each out.size() must equal its item's raw size;
  // a name may appear once.
  struct ItemRead {
    std::string name;
    absl::Span<uint8_t> out;
  };
  absl::Status ReadItems(absl::Span<const ItemRead> reads);
  // Reads bytes [offset, offset + out.size()) of an item, decoding only the
  // chunks that overlap.
  absl::Status ReadItemRange(absl::string_view name, uint64_t offset,
                             absl::Span<uint8_t> out);
  // Reads one whole chunk (item and chunk by position); out.size() must be its
  // raw size.
  absl::Status ReadChunk(uint32_t item_index, uint32_t chunk_index,
                         absl::Span<uint8_t> out);
  // Checks every chunk, those stored in base shards too; returns one error per
  // bad chunk and one per base shard that is missing or not the one named
  // (empty when the shard is intact).
  std::vector<absl::Status> VerifyAll();
  // The path of base shard `index` (1-based, as ChunkInfo.base counts).
  absl::StatusOr<std::string> BasePath(uint32_t index) const;
  // The file chunks with ChunkInfo.base == `index` lie in (0: this shard's),
  // opened on first use and checked to be the one the manifest names; owned
  // by the reader.
  absl::StatusOr<io::ReadableFile*> FileOf(uint32_t index);

 private:
  struct Piece;  // one chunk to read and where its bytes go
  // Chunks of an XOR delta's base shard to read whole.
  struct BaseChunkRead {
    uint32_t item_index;
    uint32_t chunk_index;
    const proto::Item* item;  // of the shard asking: what the base must hold
    absl::Span<uint8_t> out;
    absl::Status status;
  };
  // A file chunks are read from: the shard's own (0) or a base's.
  struct Source {
    std::string path;
    std::unique_ptr<io::ReadableFile> file;
    uint32_t version = 0;
    uint64_t data_end = 0;  // where its chunks end (its manifest's offset)
    absl::Status status;    // why it could not be opened
    // The shard as a whole, for XOR deltas against it: opened on first use.
    std::unique_ptr<ShardReader> shard;
    absl::Status shard_status;
  };
  ShardReader(io::FileSystem* fs, std::string path,
              std::unique_ptr<io::ReadableFile> file,
              const ShardReaderOptions& options);
  absl::Status LoadManifest();
  // Appends the pieces that read bytes [offset, offset + out.size()) of item
  // `name` into `out`; `whole`: out must be the whole item.
  absl::Status AddPieces(absl::string_view name, uint64_t offset,
                         absl::Span<uint8_t> out, bool whole,
                         std::vector<Piece>* pieces);
  // Opens base `index` on first use and checks it is the file named.
  Source& SourceOf(uint32_t index);
  // A reader of base `index`, for the deltas against it; checked to be the
  // shard named.
  absl::StatusOr<ShardReader*> DeltaBaseOf(uint32_t index);
  // Reads the XOR deltas among `pieces` (a window of them at a time: each
  // needs its base chunk in memory); the others are left to ReadPieces.
  absl::Status ReadDeltas(std::vector<Piece>& pieces,
                          std::vector<absl::Status>* errors);
  // Reads whole chunks of this shard for a shard with deltas against it:
  // each must be the chunk the asking shard's item expects.
  void ReadBaseChunks(std::vector<BaseChunkRead>& reads);
  // Reads and decodes `pieces`, from whichever files hold them, deltas
  // with their bases; stops at the first error unless `errors` collects them.
  absl::Status ReadPieces(std::vector<Piece>& pieces,
                          std::vector<absl::Status>* errors);
  // ReadPieces for pieces that need no other shard's chunks (or have them).
  absl::Status ReadStored(std::vector<Piece>& pieces,
                          std::vector<absl::Status>* errors);
  // Reads `pieces`, all stored in `source`.
  absl::Status ReadFrom(Source& source, std::vector<Piece>& pieces,
                        std::vector<absl::Status>* errors);
  class SourceRead;  // one ReadFrom's reads and decodes in flight
  // A piece's error, naming the shard, item, chunk and (base) file.
  absl::Status InContext(const Source& source, const Piece& p,
                         const absl::Status& st) const;
  absl::Status DecodePiece(const Piece& piece, uint32_t version,
                           const uint8_t* chunk_bytes);
  io::ThreadPool* pool();

  io::FileSystem* const fs_;
  const std::string path_;
  std::vector<Source> sources_;  // [0]: this shard; [k]: bases[k-1]
  const ShardReaderOptions options_;
  std::unique_ptr<io::ThreadPool> own_pool_;
  std::unique_ptr<io::BufferPool>
      buffers_;  // chunk-sized read buffers, reused across windows
  std::unique_ptr<io::BufferPool> delta_buffers_;  // XOR deltas' base chunks
  proto::ShardManifest manifest_;
  // Item name -> index in manifest_.items() (the first of a name): FindItem
  // in constant time, so reading a model's thousands of items is linear.
  std::unordered_map<std::string, int> item_index_;
  std::string manifest_bytes_;
  uint64_t file_size_ = 0;
};

// The footer's manifest checksum of the shard file at `path` (its footer
// checked, nothing else read): which file it is, as a later shard's
// BaseShard names it.
absl::StatusOr<uint64_t> ManifestChecksumOf(io::FileSystem* fs,
                                            const std::string& path);

// Verifies a shard file; what `ckpt verify` prints. Returns every problem found
// (empty = intact).
std::vector<absl::Status> VerifyShard(io::FileSystem* fs,
                                      const std::string& path,
                                      const ShardReaderOptions& options = {});

// Checks an item's raw bytes held outside the shard (a memory-tier staging
// slot) against the per-chunk raw checksums of `item`, taken from a verified
// manifest. Returns one error per bad chunk, at most `max_errors`, each naming
// the item, the chunk and its raw byte range; a size that differs from the
// item's is one error.
std::vector<absl::Status> VerifyRawItem(absl::Span<const uint8_t> raw,
                                        const proto::Item& item,
                                        size_t max_errors = SIZE_MAX);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_SHARD_READER_H_
