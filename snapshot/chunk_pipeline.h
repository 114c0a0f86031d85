// ChunkPipeline encodes a shard's chunks on a thread pool, a window ahead of
// the one writing them, and hands them out in file order. A chunk whose raw
// hash equals the base chunk's at its place (an incremental save) is found
// unchanged on the pool and not encoded. The codec governor is told what each
// chunk cost end to end: from handing the previous chunk to the disk to
// handing this one, the last one's cost including the drain of the writes.
// A changed chunk whose base chunk's raw bytes can be had (ReadBaseRaw) is
// also encoded as the XOR with them, and stored so when that is smaller.
//
// Thread-safety: driven by one thread; the pool's threads touch only the
// chunks being encoded. The destructor waits for them.
#ifndef CKPT_SNAPSHOT_CHUNK_PIPELINE_H_
#define CKPT_SNAPSHOT_CHUNK_PIPELINE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "io/aligned_buffer.h"
#include "io/thread_pool.h"
#include "proto/manifest.pb.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/codec_governor.h"

namespace ckpt::snapshot {

// Reads the base's raw bytes of the chunk at `raw_offset` of item
// `item_index` into `out` (its raw size). Called on the pool's threads, several
// at once.
using ReadBaseRaw = std::function<absl::Status(
    uint32_t item_index, uint64_t raw_offset, absl::Span<uint8_t> out)>;

class ChunkPipeline {
 public:
  // One chunk to store.
  struct Chunk {
    // item_index, chunk_index, raw_offset and element_width are set.
    ChunkHeader header;
    // Unchanged until the pipeline is destroyed.
    absl::Span<const uint8_t> raw;
    // The base shard's chunk at the same place, if its item matches.
    const proto::ChunkInfo* base_chunk = nullptr;
    // The raw bytes' hash, when the caller knew it.
    std::optional<uint64_t> known_xxh3;
    // Set when the chunk may be stored as the XOR with base_chunk's raw
    // bytes (float elements, format 5, a base that can give them).
    const ReadBaseRaw* read_base_raw = nullptr;
  };
  // What became of one chunk.
  struct Result {
    const Chunk* chunk = nullptr;
    // Unchanged: recorded as the base chunk, nothing to write.
    bool unchanged = false;
    ChunkHeader header;  // as encoded (sizes, codec, checksums)
    // The raw bytes' checksum (header.raw_xxh3 is the delta's for a delta).
    uint64_t raw_xxh3 = 0;
    absl::StatusOr<EncodedChunk> encoded = absl::UnknownError("pending");
    std::optional<CodecChoice> choice;  // the governor's, if it was asked
  };

  // Encodes on `pool`, or when it is null on a pool of its own of
  // `encode_threads`; `governor` may be null.
  // A delta is kept when it stores `min_delta_saving` of the chunk's stored
  // size less.
  ChunkPipeline(std::vector<Chunk> chunks, const CodecOptions& codec,
                CodecGovernor* governor, io::ThreadPool* pool,
                int encode_threads, size_t chunk_size,
                double min_delta_saving = 0.1);
  ~ChunkPipeline();
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  // Bytes the chunks can take in the file at most: every chunk that may not
  // be unchanged stored raw.
  uint64_t SpaceBound() const;
  // The next chunk in file order once it is encoded (another is scheduled
  // meanwhile); nullopt after the last.
  std::optional<Result> Next();
  // `result`, the last Next returned, is with the disk: written or, when
  // unchanged, not.
  void Handed(const Result& result);
  // Whether the last chunk's cost waits for the writes to drain.
  bool AwaitsDrain() const { return unreported_.has_value(); }
  // The writes drained (the file was flushed): the last chunk's cost.
  void Drained();

 private:
  struct Task;
  void Schedule(Task* task);
  // Encodes a changed chunk, as the XOR with its base chunk when that is
  // smaller than as it is.
  void Encode(const Chunk& chunk, uint64_t raw_xxh3, Result& result);
  // `result` replaced by the chunk's XOR delta if it is stored smaller.
  void TryDelta(const Chunk& chunk, const CodecOptions& codec, Result& result);
  double SecondsSinceLastHanded();

  const CodecOptions codec_;
  CodecGovernor* const governor_;
  const double min_delta_saving_;
  std::unique_ptr<io::ThreadPool> own_pool_;
  io::ThreadPool* pool_;
  size_t window_;
  std::unique_ptr<io::BufferPool> buffers_;
  std::vector<std::unique_ptr<Task>> tasks_;
  size_t scheduled_ = 0;  // tasks_[0, scheduled_) were handed to the pool
  size_t next_ = 0;       // the next one Next returns
  std::chrono::steady_clock::time_point last_handed_;
  // The last chunk handed to the disk, reported with the next one.
  struct Report {
    CodecChoice choice;
    uint64_t raw_bytes = 0;
    double seconds = 0;
  };
  std::optional<Report> unreported_;
};

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_CHUNK_PIPELINE_H_
