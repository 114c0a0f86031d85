#include "snapshot/chunk_pipeline.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "snapshot/format.h"

namespace ckpt::snapshot {

// A chunk on its way: encoded on a pool thread, taken in order by Next.
struct ChunkPipeline::Task {
  Chunk chunk;
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  Result result ABSL_GUARDED_BY(mu);
};

ChunkPipeline::ChunkPipeline(std::vector<Chunk> chunks,
                             const CodecOptions& codec, CodecGovernor* governor,
                             io::ThreadPool* pool, int encode_threads,
                             size_t chunk_size, double min_delta_saving)
    : codec_(codec),
      governor_(codec.codec == proto::CODEC_NONE ? nullptr : governor),
      min_delta_saving_(min_delta_saving),
      pool_(pool) {
  if (pool_ == nullptr) {
    own_pool_ = std::make_unique<io::ThreadPool>(encode_threads);
    pool_ = own_pool_.get();
  }
  window_ = static_cast<size_t>(2 * pool_->size() + 2);
  buffers_ =
      std::make_unique<io::BufferPool>(MaxEncodedSize(chunk_size), window_ + 8);
  tasks_.reserve(chunks.size());
  for (Chunk& c : chunks) {
    tasks_.push_back(std::make_unique<Task>());
    tasks_.back()->chunk = std::move(c);
  }
  while (scheduled_ < std::min(window_, tasks_.size())) {
    Schedule(tasks_[scheduled_++].get());
  }
  last_handed_ = std::chrono::steady_clock::now();
}

ChunkPipeline::~ChunkPipeline() {
  // The pool's threads write into the tasks and read the chunks' memory.
  for (size_t t = next_; t < scheduled_; ++t) {
    Task& task = *tasks_[t];
    absl::MutexLock l(&task.mu);
    task.mu.Await(absl::Condition(&task.done));
  }
}

uint64_t ChunkPipeline::SpaceBound() const {
  uint64_t bound = 0;
  for (const auto& task : tasks_) {
    // A chunk that may be unchanged is not reserved for (on a nearly full
    // disk an increment must not fail for the space of a full save).
    if (task->chunk.base_chunk == nullptr)
      bound += ChunkFootprint(kAlignment, task->chunk.raw.size());
  }
  return bound;
}

void ChunkPipeline::Schedule(Task* task) {
  pool_->Schedule([this, task] {
    const Chunk& chunk = task->chunk;
    Result result;
    result.chunk = &chunk;
    result.header = chunk.header;
    std::optional<uint64_t> hash = chunk.known_xxh3;
    if (chunk.base_chunk != nullptr) {
      if (!hash.has_value()) hash = Checksum(chunk.raw);
      result.unchanged = *hash == chunk.base_chunk->raw_xxh3();
    }
    if (result.unchanged) {
      result.encoded = EncodedChunk();
    } else {
      if (!hash.has_value()) hash = Checksum(chunk.raw);
      Encode(chunk, *hash, result);
    }
    absl::MutexLock l(&task->mu);
    task->result = std::move(result);
    task->done = true;
  });
}

void ChunkPipeline::Encode(const Chunk& chunk, uint64_t raw_xxh3,
                           Result& result) {
  CodecOptions chunk_codec = codec_;
  if (governor_ != nullptr) {
    result.choice = governor_->Choose(chunk.raw.size());
    if (!result.choice->compress) chunk_codec.codec = proto::CODEC_NONE;
    chunk_codec.zstd_level = result.choice->level;
  }
  result.raw_xxh3 = raw_xxh3;
  result.encoded =
      EncodeChunk(chunk.raw, result.header.element_width, chunk_codec,
                  buffers_.get(), &result.header, raw_xxh3);
  if (result.encoded.ok() && chunk.read_base_raw != nullptr &&
      codec_.codec != proto::CODEC_NONE) {
    // Also when the governor stored the chunk raw to spare the cores: the
    // XOR of two saves codes fast (its high planes are nearly all zeros), and
    // it spares the disk and the network most of the chunk.
    CodecOptions delta_codec = codec_;
    delta_codec.zstd_level = chunk_codec.zstd_level;
    TryDelta(chunk, delta_codec, result);
  }
}

void ChunkPipeline::TryDelta(const Chunk& chunk, const CodecOptions& codec,
                             Result& result) {
  thread_local std::vector<uint8_t> delta;
  delta.resize(chunk.raw.size());
  const absl::Span<uint8_t> bytes(delta.data(), delta.size());
  // The base's bytes, checked: a slot reused since, or a file that lies,
  // gives no delta (the chunk is stored as it is).
  if (!(*chunk.read_base_raw)(chunk.header.item_index, chunk.header.raw_offset,
                              bytes)
           .ok() ||
      Checksum(bytes) != chunk.base_chunk->raw_xxh3()) {
    return;
  }
  XorInto(bytes, chunk.raw);
  ChunkHeader header = chunk.header;
  header.xor_delta = true;
  CodecOptions delta_codec = codec;
  delta_codec.in_place = false;  // `delta` is this thread's, reused
  absl::StatusOr<EncodedChunk> encoded = EncodeChunk(
      bytes, header.element_width, delta_codec, buffers_.get(), &header);
  if (!encoded.ok() || header.codec == proto::CODEC_NONE ||
      static_cast<double>(header.stored_size) >
          (1 - min_delta_saving_) *
              static_cast<double>(result.header.stored_size)) {
    return;
  }
  result.header = header;
  result.encoded = std::move(encoded);
}

std::optional<ChunkPipeline::Result> ChunkPipeline::Next() {
  if (next_ == tasks_.size()) return std::nullopt;
  Task& task = *tasks_[next_++];
  Result result;
  {
    absl::MutexLock l(&task.mu);
    task.mu.Await(absl::Condition(&task.done));
    result = std::move(task.result);
  }
  if (result.encoded.ok() && scheduled_ < tasks_.size()) {
    Schedule(tasks_[scheduled_++].get());
  }
  return result;
}

double ChunkPipeline::SecondsSinceLastHanded() {
  const auto now = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(now - last_handed_).count();
  last_handed_ = now;
  return s;
}

void ChunkPipeline::Handed(const Result& result) {
  const double seconds = SecondsSinceLastHanded();
  // What a hash costs is not the codec's, nor is a delta made where the
  // governor chose raw.
  if (result.unchanged || governor_ == nullptr || !result.choice.has_value() ||
      (result.header.xor_delta && !result.choice->compress)) {
    return;
  }
  if (unreported_.has_value()) {
    governor_->Written(unreported_->choice, unreported_->raw_bytes,
                       unreported_->seconds);
  }
  unreported_ = Report{*result.choice, result.header.raw_size, seconds};
}

void ChunkPipeline::Drained() {
  if (!unreported_.has_value()) return;
  governor_->Written(unreported_->choice, unreported_->raw_bytes,
                     unreported_->seconds + SecondsSinceLastHanded());
  unreported_.reset();
}

}  // namespace ckpt::snapshot
