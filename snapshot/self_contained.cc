#include "snapshot/self_contained.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"
#include "io/status_macros.h"
#include "io/sync_readable_file.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/format.h"
#include "snapshot/manifest_seal.h"
#include "snapshot/shard_reader.h"

namespace ckpt::snapshot {
namespace {

// The entry of an XOR delta's chunk stored whole and raw at `file_offset`.
proto::ChunkInfo RawEntryFor(const proto::ChunkInfo& delta,
                             uint64_t file_offset) {
  proto::ChunkInfo c = delta;
  c.set_base(0);
  c.set_xor_base(0);
  c.set_delta_xxh3(0);
  c.set_xor_depth(0);
  c.set_file_offset(file_offset);
  c.set_codec(proto::CODEC_NONE);
  c.set_filter(proto::FILTER_NONE);
  c.set_stored_size(c.raw_size());
  c.set_stored_offset(kChunkHeaderSize);
  c.set_stored_xxh3(c.raw_xxh3());  // stored bytes are the raw bytes
  return c;
}

// Its header, from the delta's entry in the shard.
ChunkHeader RawHeaderFor(const proto::ChunkInfo& delta, uint32_t item,
                         uint32_t chunk, uint32_t version) {
  return HeaderFor(RawEntryFor(delta, 0), item, chunk, version);
}

// The view: consecutive byte ranges, each read from a file (a chunk where it
// lies) or from memory (the new manifest, padding and footer).
class View : public io::SyncReadableFile {
 public:
  struct Segment {
    uint64_t start = 0;  // in the view
    uint64_t length = 0;
    io::ReadableFile* file = nullptr;  // null: `tail_` or a delta's chunk
    uint64_t source = 0;               // offset in `file` or in `tail_`
    // An XOR delta stored whole and raw: chunk `chunk` of item `item`, made
    // when read (its header and bytes).
    bool materialized = false;
    uint32_t item = 0;
    uint32_t chunk = 0;
  };
  View(std::unique_ptr<ShardReader> reader, std::vector<Segment> segments,
       std::string tail, uint64_t size)
      : reader_(std::move(reader)),
        segments_(std::move(segments)),
        tail_(std::move(tail)),
        size_(size) {}

  absl::Status Read(uint64_t offset, absl::Span<uint8_t> dst) override {
    if (offset > size_ || dst.size() > size_ - offset) {
      return absl::OutOfRangeError(absl::StrCat(
          "read of ", dst.size(), " bytes at ", offset, " past the end of ",
          path(), " (", size_, " bytes, self-contained)"));
    }
    // The segment `offset` falls in, then the ones after it.
    size_t i = static_cast<size_t>(
        std::upper_bound(
            segments_.begin(), segments_.end(), offset,
            [](uint64_t at, const Segment& s) { return at < s.start; }) -
        segments_.begin() - 1);
    for (; !dst.empty(); ++i) {
      const Segment& s = segments_[i];
      const uint64_t into = offset - s.start;
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(dst.size(), s.length - into));
      if (s.materialized) {
        RETURN_IF_ERROR(Materialize(i));
        std::memcpy(dst.data(), made_.data() + into, n);
      } else if (s.file == nullptr) {
        std::memcpy(dst.data(), tail_.data() + s.source + into, n);
      } else {
        RETURN_IF_ERROR(s.file->Read(s.source + into, dst.first(n)));
      }
      dst.remove_prefix(n);
      offset += n;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Size() override { return size_; }
  const std::string& path() const override { return reader_->path(); }

 private:
  // Segment `i`'s chunk in made_, decoded through its bases, framed raw.
  absl::Status Materialize(size_t i) {
    if (made_segment_ == i) return absl::OkStatus();
    made_segment_ = SIZE_MAX;
    const Segment& s = segments_[i];
    const proto::ChunkInfo& c = reader_->manifest()
                                    .items(static_cast<int>(s.item))
                                    .chunks(static_cast<int>(s.chunk));
    made_.assign(s.length, 0);
    RETURN_IF_ERROR(reader_->ReadChunk(
        s.item, s.chunk,
        absl::MakeSpan(made_.data() + kChunkHeaderSize, c.raw_size())));
    EncodeChunkHeader(
        RawHeaderFor(c, s.item, s.chunk, reader_->manifest().format_version()),
        made_.data());
    made_segment_ = i;
    return absl::OkStatus();
  }

  std::unique_ptr<ShardReader> reader_;  // owns the files
  std::vector<Segment> segments_;
  std::string tail_;
  uint64_t size_;
  std::vector<uint8_t> made_;  // the last delta materialized
  size_t made_segment_ = SIZE_MAX;
};

}  // namespace

absl::StatusOr<SelfContained> OpenSelfContained(io::FileSystem* fs,
                                                const std::string& path) {
  ShardReaderOptions options;
  options.direct_io = false;  // reads at any offset
  ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader,
                   ShardReader::Open(fs, path, options));
  SelfContained out;
  const proto::ShardManifest& m = reader->manifest();
  if (m.bases_size() == 0) {
    out.size = reader->file_size();
    out.manifest_bytes = reader->manifest_bytes();
    ASSIGN_OR_RETURN(out.file, fs->NewReadableFile(path, {}));
    return out;
  }
  out.incremental = true;
  proto::ShardManifest flat = m;
  flat.clear_bases();
  flat.set_increments(0);
  std::vector<View::Segment> segments;
  uint64_t at = 0;
  for (int i = 0; i < flat.items_size(); ++i) {
    proto::Item& item = *flat.mutable_items(i);
    for (int c = 0; c < item.chunks_size(); ++c) {
      proto::ChunkInfo& chunk = *item.mutable_chunks(c);
      if (chunk.xor_base() > 0) {
        // Its bytes depend on other shards': stored whole, raw.
        chunk = RawEntryFor(chunk, at);
        const uint64_t footprint =
            ChunkFootprint(kChunkHeaderSize, chunk.raw_size());
        View::Segment s{at, footprint, nullptr, 0};
        s.materialized = true;
        s.item = static_cast<uint32_t>(i);
        s.chunk = static_cast<uint32_t>(c);
        segments.push_back(s);
        at += footprint;
        continue;
      }
      ASSIGN_OR_RETURN(io::ReadableFile * file, reader->FileOf(chunk.base()));
      const uint64_t footprint =
          ChunkFootprint(StoredOffset(chunk), chunk.stored_size());
      // Chunks of the same file that follow each other stay one read.
      if (!segments.empty() && segments.back().file == file &&
          segments.back().source + segments.back().length ==
              chunk.file_offset()) {
        segments.back().length += footprint;
      } else {
        segments.push_back({at, footprint, file, chunk.file_offset()});
      }
      chunk.set_base(0);
      chunk.set_file_offset(at);
      at += footprint;
    }
  }
  flat.set_data_size(at);
  flat.clear_seal();  // the rewritten manifest is sealed anew
  if (!flat.SerializeToString(&out.manifest_bytes))
    return absl::InternalError("manifest serialization failed");
  if (std::shared_ptr<const SealKeys> keys = InstalledSealKeys()) {
    out.manifest_bytes += keys->Seal(out.manifest_bytes);
  }
  const size_t tail_size = io::AlignUp(out.manifest_bytes.size() + kFooterSize);
  std::string tail(tail_size, '\0');
  std::memcpy(tail.data(), out.manifest_bytes.data(),
              out.manifest_bytes.size());
  Footer footer;
  footer.version = m.format_version();
  footer.manifest_offset = at;
  footer.manifest_size = out.manifest_bytes.size();
  footer.manifest_xxh3 =
      Checksum({reinterpret_cast<const uint8_t*>(out.manifest_bytes.data()),
                out.manifest_bytes.size()});
  footer.file_size = at + tail_size;
  EncodeFooter(footer, reinterpret_cast<uint8_t*>(tail.data()) + tail_size -
                           kFooterSize);
  segments.push_back({at, tail_size, nullptr, 0});
  out.size = footer.file_size;
  out.file = std::make_unique<View>(std::move(reader), std::move(segments),
                                    std::move(tail), out.size);
  return out;
}

absl::StatusOr<SelfContained> OpenForReceiver(
    io::FileSystem* fs, const std::string& path,
    const std::function<bool(const proto::BaseShard&)>& has_base, bool* as_is) {
  *as_is = false;
  ASSIGN_OR_RETURN(SelfContained view, OpenSelfContained(fs, path));
  if (!view.incremental) return view;
  ShardReaderOptions options;
  options.direct_io = false;
  ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> reader,
                   ShardReader::Open(fs, path, options));
  for (const proto::BaseShard& b : reader->manifest().bases()) {
    if (!has_base(b)) return view;
  }
  SelfContained own;
  ASSIGN_OR_RETURN(own.file, fs->NewReadableFile(path, {}));
  ASSIGN_OR_RETURN(own.size, own.file->Size());
  own.manifest_bytes = reader->manifest_bytes();
  *as_is = true;
  return own;
}

absl::Status WriteSelfContained(io::FileSystem* fs, SelfContained& view,
                                const std::string& path) {
  constexpr size_t kCopyBytes = 8 << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<io::WritableFile> out,
                   fs->NewWritableFile(path, {}));
  // Two buffers, used again and again: one block is read while the one
  // before is written (no fresh pages per block).
  io::AlignedBuffer buffers[2] = {
      io::AlignedBuffer(std::min<uint64_t>(kCopyBytes, view.size)),
      io::AlignedBuffer(std::min<uint64_t>(kCopyBytes, view.size))};
  int next = 0;
  for (uint64_t at = 0; at < view.size; next ^= 1) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(kCopyBytes, view.size - at));
    absl::Span<uint8_t> block = buffers[next].span().subspan(0, n);
    RETURN_IF_ERROR(view.file->Read(at, block));
    // The other buffer's write must be done before it is read into again.
    RETURN_IF_ERROR(out->Flush());
    RETURN_IF_ERROR(out->WriteBorrowed(at, block));
    at += n;
  }
  RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

absl::StatusOr<Detached> MakeSelfContained(io::FileSystem* fs,
                                           const std::string& path,
                                           bool writes_appear_whole) {
  ASSIGN_OR_RETURN(SelfContained view, OpenSelfContained(fs, path));
  Detached out;
  out.size = view.size;
  out.manifest_bytes = view.manifest_bytes;
  out.manifest_xxh3 =
      Checksum({reinterpret_cast<const uint8_t*>(out.manifest_bytes.data()),
                out.manifest_bytes.size()});
  if (!view.incremental) return out;  // its own file already
  if (writes_appear_whole) {
    RETURN_IF_ERROR(WriteSelfContained(fs, view, path));
    return out;
  }
  const std::string temp = path + ".detach.tmp";
  absl::Status written = WriteSelfContained(fs, view, temp);
  if (written.ok()) written = fs->Rename(temp, path);
  if (!written.ok()) {
    (void)fs->Unlink(temp);
    return written;
  }
  RETURN_IF_ERROR(fs->SyncDir(io::DirName(path)));
  return out;
}

}  // namespace ckpt::snapshot
