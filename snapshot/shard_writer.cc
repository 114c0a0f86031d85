#include "snapshot/shard_writer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "io/kill_point.h"
#include "io/status_macros.h"
#include "snapshot/chunk_pipeline.h"
#include "snapshot/dtype.h"
#include "snapshot/manifest_seal.h"
#include "snapshot/names.h"

namespace ckpt::snapshot {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The base's item that chunks of `item` (the manifest's item `index`) may be
// stored in: same position, name, kind, dtype, shape and box, in a base of
// the same job, rank, world size, chunk size and format. Null if none.
const proto::Item* BaseItem(const ShardBase* base,
                            const proto::ShardManifest& m, int index) {
  if (base == nullptr) return nullptr;
  const proto::ShardManifest& b = base->manifest;
  if (b.format_version() != m.format_version() || b.job() != m.job() ||
      b.rank() != m.rank() || b.world_size() != m.world_size() ||
      b.chunk_size() != m.chunk_size() || b.step() >= m.step() ||
      index >= b.items_size()) {
    return nullptr;
  }
  const proto::Item& item = m.items(index);
  const proto::Item& old = b.items(index);
  auto same = [](const auto& x, const auto& y) {
    return std::equal(x.begin(), x.end(), y.begin(), y.end());
  };
  if (old.name() != item.name() || old.kind() != item.kind() ||
      old.dtype() != item.dtype() || old.raw_size() != item.raw_size() ||
      !same(old.global_shape(), item.global_shape()) ||
      !same(old.box_offset(), item.box_offset()) ||
      !same(old.box_length(), item.box_length())) {
    return nullptr;
  }
  return &old;
}

}  // namespace

ShardWriter::ShardWriter(io::FileSystem* fs, std::string path, ShardInfo info,
                         ShardWriterOptions options)
    : fs_(fs),
      path_(std::move(path)),
      temp_path_(absl::StrCat(path_, kTempSuffix)),
      options_(std::move(options)) {
  manifest_.set_format_version(options_.codec.format_version);
  manifest_.set_job(info.job);
  manifest_.set_step(info.step);
  manifest_.set_rank(info.rank);
  manifest_.set_world_size(info.world_size);
  manifest_.set_chunk_size(options_.chunk_size);
  manifest_.set_alignment(kAlignment);
}

absl::Status ShardWriter::AddTensor(const TensorRef& t) {
  proto::Item item;
  item.set_name(t.name);
  item.set_kind(proto::ITEM_KIND_TENSOR);
  item.set_dtype(t.dtype);
  for (size_t d = 0; d < t.global_shape.size(); ++d)
    item.add_global_shape(t.global_shape[d]);
  for (int64_t off : t.box_offset) item.add_box_offset(off);
  for (int64_t len : t.box_length) item.add_box_length(len);
  ASSIGN_OR_RETURN(uint64_t size, ValidateTensorBox(item));
  if (size != t.data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", t.name, "\": box needs ", size,
                     " bytes, data has ", t.data.size()));
  }
  return AddItem(std::move(item), t.data, t.chunk_xxh3);
}

absl::Status ShardWriter::AddBytes(absl::string_view name,
                                   absl::Span<const uint8_t> data,
                                   absl::Span<const uint64_t> chunk_xxh3) {
  proto::Item item;
  item.set_name(std::string(name));
  item.set_kind(proto::ITEM_KIND_BYTES);
  return AddItem(std::move(item), data, chunk_xxh3);
}

absl::Status ShardWriter::AddItem(proto::Item item,
                                  absl::Span<const uint8_t> data,
                                  absl::Span<const uint64_t> chunk_xxh3) {
  if (committed_)
    return absl::FailedPreconditionError("shard writer already committed");
  RETURN_IF_ERROR(ValidateItemName(item.name()));
  if (names_.count(item.name()) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("item \"", item.name(), "\" is already in shard ", path_));
  }
  const uint64_t chunks = ChunkCount(data.size(), options_.chunk_size);
  if (!chunk_xxh3.empty() && chunk_xxh3.size() != chunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("item \"", item.name(), "\": ", chunk_xxh3.size(),
                     " chunk hashes given for ", chunks, " chunks of ",
                     options_.chunk_size, " bytes"));
  }
  item.set_raw_size(data.size());
  names_.insert(item.name());
  *manifest_.add_items() = std::move(item);
  data_.push_back(data);
  known_xxh3_.push_back(chunk_xxh3);
  return absl::OkStatus();
}

absl::Status ShardWriter::Fail(absl::Status status) {
  // Best effort: a leftover temporary file is never mistaken for a shard and is
  // removed by GC.
  (void)fs_->Unlink(temp_path_);
  return absl::Status(status.code(), absl::StrCat("writing shard ", path_, ": ",
                                                  status.message()));
}

absl::StatusOr<proto::ShardManifest> ShardWriter::Commit() {
  if (committed_)
    return absl::FailedPreconditionError("shard writer already committed");
  committed_ = true;
  if (!manifest_.job().empty()) RETURN_IF_ERROR(ValidateJobId(manifest_.job()));
  if (manifest_.world_size() == 0 ||
      manifest_.rank() >= manifest_.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", manifest_.rank(),
                                                   " is outside world size ",
                                                   manifest_.world_size()));
  }
  if (options_.chunk_size == 0 || options_.chunk_size > kMaxChunkSize ||
      options_.chunk_size % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk size ", options_.chunk_size,
                     " must be a multiple of 8 in (0, ", kMaxChunkSize, "]"));
  }
  RETURN_IF_ERROR(CheckWrittenFormat(options_.codec.format_version));
  manifest_.set_created_unix_micros(NowMicros());

  io::FileOptions file_options{.direct = options_.direct_io};
  if (!options_.recycle_from.empty() &&
      fs_->Rename(options_.recycle_from, temp_path_).ok()) {
    file_options.truncate = false;
  }
  absl::StatusOr<std::unique_ptr<io::WritableFile>> file =
      fs_->NewWritableFile(temp_path_, file_options);
  if (!file.ok()) return Fail(file.status());
  absl::Status s = WriteAll(file->get());
  if (s.ok()) {
    CKPT_KILL_POINT("shard.before_sync");
    s = (*file)->Sync();
  }
  absl::Status closed = (*file)->Close();
  if (s.ok()) s = closed;
  if (!s.ok()) return Fail(s);
  CKPT_KILL_POINT("shard.after_sync");
  s = fs_->Rename(temp_path_, path_);
  if (!s.ok()) return Fail(s);
  CKPT_KILL_POINT("shard.after_rename");
  s = fs_->SyncDir(io::DirName(path_));
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("writing shard ", path_,
                               ": renamed but not durable: ", s.message()));
  }
  CKPT_KILL_POINT("shard.after_dir_sync");
  return manifest_;
}

uint32_t ShardWriter::BaseIndex(uint32_t in_base) {
  const ShardBase& base = *options_.base;
  proto::BaseShard where;
  if (in_base == 0) {
    where.set_step(base.manifest.step());
    where.set_manifest_xxh3(base.manifest_xxh3);
  } else {
    where = base.manifest.bases(static_cast<int>(in_base) - 1);
  }
  for (int i = 0; i < manifest_.bases_size(); ++i) {
    if (manifest_.bases(i).step() == where.step())
      return static_cast<uint32_t>(i + 1);
  }
  *manifest_.add_bases() = where;
  return static_cast<uint32_t>(manifest_.bases_size());
}

absl::Status ShardWriter::WriteAll(io::WritableFile* file) {
  ChunkPipeline pipeline(PlanChunks(), options_.codec, options_.governor.get(),
                         options_.pool, options_.encode_threads,
                         options_.chunk_size, options_.min_delta_saving);
  // The data region never exceeds every chunk stored raw; reserving it up
  // front keeps the O_DIRECT writes from extending the file. The tail write
  // extends it, then Truncate trims.
  RETURN_IF_ERROR(file->Allocate(pipeline.SpaceBound()));
  uint64_t file_pos = 0;
  while (std::optional<ChunkPipeline::Result> chunk = pipeline.Next()) {
    RETURN_IF_ERROR(chunk->encoded.status());
    if (chunk->unchanged) {
      RecordUnchanged(chunk->header.item_index, *chunk->chunk->base_chunk);
      pipeline.Handed(*chunk);
      continue;
    }
    RecordStored(*chunk, file_pos);
    // A chunk stored in place is written from the caller's memory, which
    // stays unchanged until Commit() returns.
    const uint64_t footprint = chunk->encoded->size();
    RETURN_IF_ERROR(WriteChunk(file, file_pos, *std::move(chunk->encoded)));
    file_pos += footprint;
    pipeline.Handed(*chunk);
    CKPT_KILL_POINT("shard.chunk_written");
    if (options_.on_chunk) options_.on_chunk();
    if (options_.cancel != nullptr &&
        options_.cancel->load(std::memory_order_relaxed)) {
      return absl::CancelledError("cancelled: the daemon is stopping");
    }
  }
  ASSIGN_OR_RETURN(const uint64_t file_size, WriteTail(file, file_pos));
  if (pipeline.AwaitsDrain()) {
    RETURN_IF_ERROR(file->Flush());
    pipeline.Drained();
  }
  return file->Truncate(file_size);
}

std::vector<ChunkPipeline::Chunk> ShardWriter::PlanChunks() {
  // Every chunk of every item, in file order.
  std::vector<ChunkPipeline::Chunk> chunks;
  for (int i = 0; i < manifest_.items_size(); ++i) {
    const proto::Item& item = manifest_.items(i);
    const uint32_t width = item.kind() == proto::ITEM_KIND_TENSOR
                               ? static_cast<uint32_t>(DTypeSize(item.dtype()))
                               : 1;
    absl::Span<const uint8_t> data = data_[i];
    const proto::Item* base_item = BaseItem(options_.base.get(), manifest_, i);
    const ReadBaseRaw* read_base_raw =
        base_item != nullptr && options_.xor_deltas &&
                manifest_.format_version() >= kDeltaFormatVersion &&
                options_.base->read_raw && IsWideFloat(item.dtype())
            ? &options_.base->read_raw
            : nullptr;
    uint32_t index = 0;
    for (uint64_t off = 0; off < data.size();
         off += options_.chunk_size, ++index) {
      ChunkPipeline::Chunk& chunk = chunks.emplace_back();
      chunk.header.item_index = static_cast<uint32_t>(i);
      chunk.header.chunk_index = index;
      chunk.header.raw_offset = off;
      chunk.header.element_width = width;
      chunk.raw = data.subspan(
          off, std::min<uint64_t>(options_.chunk_size, data.size() - off));
      if (!known_xxh3_[i].empty()) chunk.known_xxh3 = known_xxh3_[i][index];
      if (base_item != nullptr &&
          index < static_cast<uint32_t>(base_item->chunks_size())) {
        const proto::ChunkInfo& old = base_item->chunks(index);
        if (old.raw_offset() == off && old.raw_size() == chunk.raw.size() &&
            old.element_width() == width) {
          chunk.base_chunk = &old;
          if (old.xor_depth() < options_.max_delta_depth)
            chunk.read_base_raw = read_base_raw;
        }
      }
    }
  }
  return chunks;
}

void ShardWriter::RecordUnchanged(uint32_t item_index,
                                  const proto::ChunkInfo& base_chunk) {
  ++stats_.unchanged;
  proto::ChunkInfo* info = manifest_.mutable_items(item_index)->add_chunks();
  *info = base_chunk;
  info->set_base(BaseIndex(base_chunk.base()));
  // A delta against a shard the base names: the same shard, named here.
  if (base_chunk.xor_base() > 0)
    info->set_xor_base(BaseIndex(base_chunk.xor_base()));
}

void ShardWriter::RecordStored(const ChunkPipeline::Result& result,
                               uint64_t file_offset) {
  const ChunkHeader& h = result.header;
  const std::optional<CodecChoice>& choice = result.choice;
  if (h.xor_delta) ++stats_.deltas;
  if (h.codec != proto::CODEC_NONE) {
    ++stats_.compressed;
  } else if (choice.has_value() && !choice->compress) {
    ++stats_.raw_chosen;
  } else {
    ++stats_.raw_incompressible;
  }
  proto::ChunkInfo* info = manifest_.mutable_items(h.item_index)->add_chunks();
  info->set_file_offset(file_offset);
  info->set_raw_offset(h.raw_offset);
  info->set_raw_size(h.raw_size);
  info->set_stored_size(h.stored_size);
  info->set_codec(h.codec);
  info->set_filter(h.filter);
  info->set_element_width(h.element_width);
  info->set_raw_xxh3(result.raw_xxh3);
  info->set_stored_xxh3(h.stored_xxh3);
  info->set_stored_offset(h.stored_offset);
  if (h.xor_delta) {
    // Against the base shard itself, wherever it stores that chunk.
    info->set_xor_base(BaseIndex(0));
    info->set_delta_xxh3(h.raw_xxh3);
    info->set_xor_depth(result.chunk->base_chunk->xor_depth() + 1);
  }
}

absl::Status ShardWriter::WriteChunk(io::WritableFile* file, uint64_t at,
                                     EncodedChunk encoded) {
  const uint64_t body_at = at + encoded.head.size();
  RETURN_IF_ERROR(file->Write(at, std::move(encoded.head)));
  if (!encoded.body.empty()) {
    RETURN_IF_ERROR(file->WriteBorrowed(body_at, encoded.body));
  }
  if (!encoded.tail.empty()) {
    RETURN_IF_ERROR(
        file->Write(body_at + encoded.body.size(), std::move(encoded.tail)));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ShardWriter::WriteTail(io::WritableFile* file,
                                                uint64_t data_size) {
  // The tail: manifest, zero padding, footer; together a multiple of the
  // alignment.
  manifest_.set_data_size(data_size);
  if (manifest_.bases_size() > 0)
    manifest_.set_increments(options_.base->manifest.increments() + 1);
  std::string serialized;
  if (!manifest_.SerializeToString(&serialized)) {
    return absl::InternalError("manifest serialization failed");
  }
  if (std::shared_ptr<const SealKeys> keys = InstalledSealKeys()) {
    serialized += keys->Seal(serialized);  // the manifest's last field
  }
  if (serialized.size() > kMaxManifestSize) {
    return absl::ResourceExhaustedError(
        absl::StrCat("manifest is ", serialized.size(), " bytes; the limit is ",
                     kMaxManifestSize));
  }
  const size_t tail_size = io::AlignUp(serialized.size() + kFooterSize);
  io::AlignedBuffer tail(tail_size);
  std::memset(tail.data(), 0, tail_size);
  std::memcpy(tail.data(), serialized.data(), serialized.size());
  Footer footer;
  footer.version = manifest_.format_version();
  footer.manifest_offset = data_size;
  footer.manifest_size = serialized.size();
  footer.manifest_xxh3 = Checksum(
      {reinterpret_cast<const uint8_t*>(serialized.data()), serialized.size()});
  footer.file_size = data_size + tail_size;
  manifest_xxh3_ = footer.manifest_xxh3;
  EncodeFooter(footer, tail.data() + tail_size - kFooterSize);
  RETURN_IF_ERROR(file->Write(data_size, std::move(tail)));
  return footer.file_size;
}

}  // namespace ckpt::snapshot
