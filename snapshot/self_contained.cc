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

// The view: consecutive byte ranges, each read from a file (a chunk where it
// lies) or from memory (the new manifest, padding and footer).
class View : public io::SyncReadableFile {
 public:
  struct Segment {
    uint64_t start = 0;  // in the view
    uint64_t length = 0;
    io::ReadableFile* file = nullptr;  // null: `tail_`
    uint64_t source = 0;               // offset in `file` or in `tail_`
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
      if (s.file == nullptr) {
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
  std::unique_ptr<ShardReader> reader_;  // owns the files
  std::vector<Segment> segments_;
  std::string tail_;
  uint64_t size_;
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
  for (proto::Item& item : *flat.mutable_items()) {
    for (proto::ChunkInfo& chunk : *item.mutable_chunks()) {
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

absl::Status WriteSelfContained(io::FileSystem* fs, SelfContained& view,
                                const std::string& path) {
  constexpr size_t kCopyBytes = 8 << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<io::WritableFile> out,
                   fs->NewWritableFile(path, {}));
  for (uint64_t at = 0; at < view.size;) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(kCopyBytes, view.size - at));
    io::AlignedBuffer buffer(n);
    RETURN_IF_ERROR(view.file->Read(at, buffer.span()));
    RETURN_IF_ERROR(out->Write(at, std::move(buffer)));
    at += n;
  }
  RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

}  // namespace ckpt::snapshot
