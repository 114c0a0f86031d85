#include "snapshot/shard_reader.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "io/aligned_buffer.h"
#include "io/status_macros.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/format.h"
#include "snapshot/shard_check.h"
#include "snapshot/shard_reader_piece.h"

namespace ckpt::snapshot {

ShardReader::ShardReader(io::FileSystem* fs, std::string path,
                         std::unique_ptr<io::ReadableFile> file,
                         const ShardReaderOptions& options)
    : fs_(fs), path_(std::move(path)), options_(options) {
  sources_.resize(1);
  sources_[0].path = path_;
  sources_[0].file = std::move(file);
}

ShardReader::~ShardReader() = default;

absl::StatusOr<std::unique_ptr<ShardReader>> ShardReader::Open(
    io::FileSystem* fs, const std::string& path,
    const ShardReaderOptions& options) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<io::ReadableFile> file,
      fs->NewReadableFile(path, io::FileOptions{.direct = options.direct_io}));
  std::unique_ptr<ShardReader> reader(
      new ShardReader(fs, path, std::move(file), options));
  absl::Status s = reader->LoadManifest();
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("shard ", path, ": ", s.message()));
  }
  return reader;
}

namespace {

// Reads and checks the footer of a shard file of `file_size` bytes.
absl::StatusOr<Footer> ReadFooter(io::ReadableFile* file, uint64_t file_size) {
  if (file_size < kAlignment || file_size % kAlignment != 0) {
    return CheckFooter({}, file_size).status();  // names the size
  }
  io::AlignedBuffer last(kAlignment);
  RETURN_IF_ERROR(file->Read(file_size - kAlignment, last.span()));
  return CheckFooter(last.span(), file_size);
}

}  // namespace

absl::Status ShardReader::LoadManifest() {
  io::ReadableFile* file = sources_[0].file.get();
  ASSIGN_OR_RETURN(file_size_, file->Size());
  ASSIGN_OR_RETURN(Footer footer, ReadFooter(file, file_size_));
  const size_t tail_size = file_size_ - footer.manifest_offset;
  io::AlignedBuffer tail(tail_size);
  RETURN_IF_ERROR(file->Read(footer.manifest_offset, tail.span()));
  ASSIGN_OR_RETURN(manifest_, CheckManifest(tail.span(), footer));
  item_index_.reserve(static_cast<size_t>(manifest_.items_size()));
  for (int i = 0; i < manifest_.items_size(); ++i) {
    item_index_.try_emplace(manifest_.items(i).name(), i);
  }
  const uint8_t* manifest_bytes = tail.data();
  manifest_bytes_.assign(reinterpret_cast<const char*>(manifest_bytes),
                         footer.manifest_size);
  sources_[0].version = footer.version;
  sources_[0].data_end = footer.manifest_offset;
  sources_.resize(manifest_.bases_size() + 1);
  const size_t window_chunks =
      options_.read_window_bytes / manifest_.chunk_size() + 1;
  buffers_ = std::make_unique<io::BufferPool>(
      ChunkFootprint(kAlignment, manifest_.chunk_size() + 1024),
      2 * window_chunks + 2);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ShardReader::BasePath(uint32_t index) const {
  if (index == 0 || index > static_cast<uint32_t>(manifest_.bases_size()))
    return absl::OutOfRangeError(absl::StrCat("no base shard ", index));
  const uint64_t step = manifest_.bases(static_cast<int>(index) - 1).step();
  if (options_.base_path) return options_.base_path(step);
  return SiblingShardPath(path_, step);
}

ShardReader::Source& ShardReader::SourceOf(uint32_t index) {
  Source& source = sources_[index];
  if (index == 0 || source.file != nullptr || !source.status.ok())
    return source;
  const proto::BaseShard& base = manifest_.bases(static_cast<int>(index) - 1);
  auto fail = [&](const absl::Status& why, absl::string_view what) {
    source.status = absl::DataLossError(absl::StrCat(
        "base shard step ", base.step(),
        source.path.empty() ? "" : absl::StrCat(" (", source.path, ")"), " ",
        what, ": ", why.message()));
    source.file.reset();
    return std::ref(source);
  };
  absl::StatusOr<std::string> path = BasePath(index);
  if (!path.ok()) return fail(path.status(), "cannot be found");
  source.path = *path;
  absl::StatusOr<std::unique_ptr<io::ReadableFile>> file = fs_->NewReadableFile(
      source.path, io::FileOptions{.direct = options_.direct_io});
  if (!file.ok()) return fail(file.status(), "is missing");
  source.file = *std::move(file);
  absl::StatusOr<uint64_t> size = source.file->Size();
  if (!size.ok()) return fail(size.status(), "is unreadable");
  absl::StatusOr<Footer> footer = ReadFooter(source.file.get(), *size);
  if (!footer.ok()) return fail(footer.status(), "is damaged");
  if (footer->manifest_xxh3 != base.manifest_xxh3()) {
    return fail(absl::DataLossError(absl::StrFormat(
                    "its manifest checksum is %016x, this shard was saved "
                    "against %016x",
                    footer->manifest_xxh3, base.manifest_xxh3())),
                "is not the shard this one was saved against");
  }
  source.version = footer->version;
  source.data_end = footer->manifest_offset;
  return source;
}

absl::StatusOr<io::ReadableFile*> ShardReader::FileOf(uint32_t index) {
  if (index > static_cast<uint32_t>(manifest_.bases_size()))
    return absl::OutOfRangeError(absl::StrCat("no base shard ", index));
  Source& source = SourceOf(index);
  if (!source.status.ok()) {
    return absl::Status(
        source.status.code(),
        absl::StrCat("shard ", path_, ": ", source.status.message()));
  }
  return source.file.get();
}

io::ThreadPool* ShardReader::pool() {
  if (options_.pool != nullptr) return options_.pool;
  if (own_pool_ == nullptr)
    own_pool_ = std::make_unique<io::ThreadPool>(options_.decode_threads);
  return own_pool_.get();
}

absl::StatusOr<const proto::Item*> ShardReader::FindItem(
    absl::string_view name) const {
  auto it = item_index_.find(std::string(name));
  if (it != item_index_.end()) return &manifest_.items(it->second);
  return absl::NotFoundError(
      absl::StrCat("shard ", path_, " has no item \"", name, "\""));
}

absl::Status ShardReader::ReadItem(absl::string_view name,
                                   absl::Span<uint8_t> out) {
  std::vector<Piece> pieces;
  RETURN_IF_ERROR(AddPieces(name, 0, out, /*whole=*/true, &pieces));
  return ReadPieces(pieces, nullptr);
}

absl::Status ShardReader::ReadItems(absl::Span<const ItemRead> reads) {
  std::vector<Piece> pieces;
  std::set<std::string> seen;
  for (const ItemRead& read : reads) {
    if (!seen.insert(read.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", path_, " item \"", read.name, "\" is asked for twice"));
    }
    RETURN_IF_ERROR(AddPieces(read.name, 0, read.out, /*whole=*/true, &pieces));
  }
  return ReadPieces(pieces, nullptr);
}

absl::Status ShardReader::ReadItemRange(absl::string_view name, uint64_t offset,
                                        absl::Span<uint8_t> out) {
  std::vector<Piece> pieces;
  RETURN_IF_ERROR(AddPieces(name, offset, out, /*whole=*/false, &pieces));
  return ReadPieces(pieces, nullptr);
}

absl::Status ShardReader::ReadChunk(uint32_t item_index, uint32_t chunk_index,
                                    absl::Span<uint8_t> out) {
  if (item_index >= static_cast<uint32_t>(manifest_.items_size()) ||
      chunk_index >=
          static_cast<uint32_t>(
              manifest_.items(static_cast<int>(item_index)).chunks_size())) {
    return absl::OutOfRangeError(absl::StrCat("shard ", path_, " has no chunk ",
                                              chunk_index, " of item ",
                                              item_index));
  }
  const proto::Item& item = manifest_.items(static_cast<int>(item_index));
  if (out.size() != item.chunks(static_cast<int>(chunk_index)).raw_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", path_, " item \"", item.name(), "\" chunk ",
                     chunk_index, ": a buffer of ", out.size(), " bytes for ",
                     item.chunks(static_cast<int>(chunk_index)).raw_size()));
  }
  std::vector<Piece> pieces{Piece{&item, item_index, chunk_index, 0, out}};
  return ReadPieces(pieces, nullptr);
}

absl::Status ShardReader::AddPieces(absl::string_view name, uint64_t offset,
                                    absl::Span<uint8_t> out, bool whole,
                                    std::vector<Piece>* pieces) {
  ASSIGN_OR_RETURN(const proto::Item* item, FindItem(name));
  if (whole && out.size() != item->raw_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", path_, " item \"", name, "\" has ",
                     item->raw_size(), " bytes; the buffer ", out.size()));
  }
  uint32_t item_index = 0;
  while (&manifest_.items(static_cast<int>(item_index)) != item) ++item_index;
  if (offset > item->raw_size() || out.size() > item->raw_size() - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "shard ", path_, " item \"", name, "\": range [", offset, ", +",
        out.size(), ") is outside its ", item->raw_size(), " bytes"));
  }
  const uint64_t end = offset + out.size();
  for (int c = 0; c < item->chunks_size(); ++c) {
    const proto::ChunkInfo& chunk = item->chunks(c);
    uint64_t lo = std::max<uint64_t>(offset, chunk.raw_offset());
    uint64_t hi =
        std::min<uint64_t>(end, chunk.raw_offset() + chunk.raw_size());
    if (lo >= hi) continue;
    pieces->push_back(Piece{item, item_index, static_cast<uint32_t>(c),
                            lo - chunk.raw_offset(),
                            out.subspan(lo - offset, hi - lo)});
  }
  return absl::OkStatus();
}

std::vector<absl::Status> ShardReader::VerifyAll() {
  std::vector<Piece> pieces;
  for (int i = 0; i < manifest_.items_size(); ++i) {
    const proto::Item& item = manifest_.items(i);
    for (int c = 0; c < item.chunks_size(); ++c) {
      pieces.push_back(Piece{
          &item, static_cast<uint32_t>(i), static_cast<uint32_t>(c), 0, {}});
    }
  }
  std::vector<absl::Status> errors;
  absl::Status s = ReadPieces(pieces, &errors);
  if (!s.ok()) errors.push_back(s);
  return errors;
}

absl::Status ShardReader::DecodePiece(const Piece& piece, uint32_t version,
                                      const uint8_t* bytes) {
  const proto::ChunkInfo& chunk = piece.item->chunks(piece.chunk_index);
  ASSIGN_OR_RETURN(ChunkHeader header,
                   CheckChunkFrame(chunk, piece.item_index, piece.chunk_index,
                                   version, bytes));
  const uint8_t* stored = bytes + header.stored_offset;
  const bool whole = piece.begin == 0 && piece.out.size() == chunk.raw_size();
  if (chunk.xor_base() > 0 && piece.xor_with == nullptr)
    return absl::InternalError("an XOR delta read without its base chunk");
  if (whole && piece.xor_with == nullptr)
    return DecodeChunk(header, {stored, chunk.stored_size()}, piece.out);
  // Partial chunk (range reads), verification only or a delta: decode into
  // scratch unless the whole chunk goes to `out`.
  thread_local std::vector<uint8_t> scratch;
  absl::Span<uint8_t> raw = piece.out;
  if (!whole) {
    scratch.resize(chunk.raw_size());
    raw = absl::Span<uint8_t>(scratch.data(), scratch.size());
  }
  RETURN_IF_ERROR(DecodeChunk(header, {stored, chunk.stored_size()}, raw));
  if (piece.xor_with != nullptr) {
    XorInto(raw, {piece.xor_with, raw.size()});
    if (Checksum(raw) != chunk.raw_xxh3()) {
      return absl::DataLossError(absl::StrCat(
          "raw checksum mismatch after the XOR with the chunk of step ",
          manifest_.bases(static_cast<int>(chunk.xor_base()) - 1).step()));
    }
  }
  if (!whole && !piece.out.empty()) {
    std::memcpy(piece.out.data(), scratch.data() + piece.begin,
                piece.out.size());
  }
  return absl::OkStatus();
}

absl::Status ShardReader::ReadPieces(std::vector<Piece>& pieces,
                                     std::vector<absl::Status>* errors) {
  std::vector<Piece> stored, deltas;
  for (const Piece& p : pieces) {
    (p.item->chunks(p.chunk_index).xor_base() > 0 ? deltas : stored)
        .push_back(p);
  }
  if (!deltas.empty()) RETURN_IF_ERROR(ReadDeltas(deltas, errors));
  return ReadStored(stored, errors);
}

absl::Status ShardReader::ReadStored(std::vector<Piece>& pieces,
                                     std::vector<absl::Status>* errors) {
  std::map<uint32_t, std::vector<Piece>> by_source;
  for (const Piece& p : pieces)
    by_source[p.item->chunks(p.chunk_index).base()].push_back(p);
  for (auto& [index, group] : by_source) {
    Source& source = SourceOf(index);
    if (!source.status.ok()) {
      // One error for the base, naming what is stored there.
      std::set<std::string> items;
      for (const Piece& p : group) items.insert(p.item->name());
      std::string names;
      size_t named = 0;
      for (const std::string& name : items) {
        if (named++ == 3) {
          absl::StrAppend(&names, " and ", items.size() - 3, " more");
          break;
        }
        absl::StrAppend(&names, named > 1 ? ", \"" : "\"", name, "\"");
      }
      absl::Status e(source.status.code(),
                     absl::StrCat("shard ", path_, ": ",
                                  source.status.message(), "; ", group.size(),
                                  " chunks of ", names, " are stored there"));
      if (errors == nullptr) return e;
      errors->push_back(std::move(e));
      continue;
    }
    RETURN_IF_ERROR(ReadFrom(source, group, errors));
  }
  return absl::OkStatus();
}

// One ReadFrom: reads issued in file order and kept flowing, each completed
// read decoded on the pool while the next ones are in flight, with at most
// `max_ahead` chunks read but not decoded.
class ShardReader::SourceRead {
 public:
  SourceRead(ShardReader& reader, Source& source, std::vector<Piece>& pieces,
             bool first_error_only)
      : reader_(reader),
        source_(source),
        pieces_(pieces),
        first_error_only_(first_error_only),
        max_ahead_(std::max<size_t>(2, reader.options_.read_window_bytes /
                                           reader.manifest_.chunk_size())),
        buffers_(pieces.size()) {}

  // Every piece read and decoded, or failed; an error of the engine itself.
  absl::Status Run() {
    absl::Status io_error;
    while (true) {
      const size_t done = Finished();
      if (issued_ < pieces_.size() && !Stopped() && io_error.ok() &&
          issued_ - done < max_ahead_) {
        io_error = IssueNext();
      } else if (reads_completed_ < issued_) {
        absl::Status s = source_.file->WaitAny();
        // The engine is broken: nothing more will complete.
        if (!s.ok()) return Drained(io_error.ok() ? s : io_error);
      } else if (done < issued_) {
        WaitFinished(done + 1);
      } else {
        break;
      }
    }
    return Drained(io_error);
  }

  size_t issued() const { return issued_; }

 private:
  size_t Finished() {
    absl::MutexLock l(&mu_);
    return finished_;
  }
  // An error when the caller wants only the first one.
  bool Stopped() {
    absl::MutexLock l(&mu_);
    return first_error_only_ && failed_;
  }
  void WaitFinished(size_t target) {
    absl::MutexLock l(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return finished_ >= target;
    };
    mu_.Await(absl::Condition(&reached));
  }
  // Decodes still queued reference `pieces` and `buffers`: waits for them.
  absl::Status Drained(absl::Status io_error) {
    WaitFinished(reads_completed_);
    return io_error;
  }
  void Finish(bool ok) {
    absl::MutexLock l(&mu_);
    ++finished_;
    if (!ok) failed_ = true;
  }

  // The next piece's read, into a pooled buffer; an error of the engine.
  absl::Status IssueNext() {
    const size_t i = issued_++;
    const proto::ChunkInfo& chunk =
        pieces_[i].item->chunks(pieces_[i].chunk_index);
    const uint64_t footprint =
        ChunkFootprint(StoredOffset(chunk), chunk.stored_size());
    if (chunk.file_offset() > source_.data_end ||
        footprint > source_.data_end - chunk.file_offset()) {
      // Only a base can be asked for this (the manifest tiles its own file).
      pieces_[i].status = absl::DataLossError(
          absl::StrCat("the chunk lies past the chunks of ", source_.path));
      Finish(false);
      ++reads_completed_;
      return absl::OkStatus();
    }
    buffers_[i] = footprint <= reader_.buffers_->buffer_capacity()
                      ? reader_.buffers_->Acquire()
                      : io::AlignedBuffer(footprint);
    buffers_[i].set_size(footprint);
    absl::Status s = source_.file->ReadAsync(
        chunk.file_offset(), buffers_[i].span(),
        [this, i](absl::Status st) { OnRead(i, std::move(st)); });
    if (!s.ok()) --issued_;
    return s;
  }

  void OnRead(size_t i, absl::Status status) {
    ++reads_completed_;
    if (!status.ok()) {
      pieces_[i].status = std::move(status);
      buffers_[i] = io::AlignedBuffer();
      Finish(false);
      return;
    }
    reader_.pool()->Schedule([this, i] {
      pieces_[i].status =
          reader_.DecodePiece(pieces_[i], source_.version, buffers_[i].data());
      buffers_[i] = io::AlignedBuffer();  // back to the pool for next reads
      Finish(pieces_[i].status.ok());
    });
  }

  ShardReader& reader_;
  Source& source_;
  std::vector<Piece>& pieces_;
  const bool first_error_only_;
  const size_t max_ahead_;
  std::vector<io::AlignedBuffer> buffers_;
  // On the reading thread.
  size_t issued_ = 0;
  size_t reads_completed_ = 0;
  // Between it and the decoding threads.
  absl::Mutex mu_;
  size_t finished_ ABSL_GUARDED_BY(mu_) = 0;  // pieces decoded or failed
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status ShardReader::ReadFrom(Source& source, std::vector<Piece>& pieces,
                                   std::vector<absl::Status>* errors) {
  if (pieces.empty()) return absl::OkStatus();
  SourceRead read(*this, source, pieces,
                  /*first_error_only=*/errors == nullptr);
  RETURN_IF_ERROR(read.Run());
  for (size_t i = 0; i < read.issued(); ++i) {
    if (pieces[i].status.ok()) continue;
    absl::Status error = InContext(source, pieces[i], pieces[i].status);
    if (errors == nullptr) return error;
    errors->push_back(std::move(error));
  }
  return absl::OkStatus();
}

absl::Status ShardReader::InContext(const Source& source, const Piece& p,
                                    const absl::Status& st) const {
  const proto::ChunkInfo& chunk = p.item->chunks(p.chunk_index);
  const std::string in_base =
      chunk.base() == 0
          ? std::string()
          : absl::StrCat(
                " (stored in base shard step ",
                manifest_.bases(static_cast<int>(chunk.base()) - 1).step(),
                ", ", source.path, ")");
  return absl::Status(
      st.code(),
      absl::StrCat("shard ", path_, " item \"", p.item->name(), "\" chunk ",
                   p.chunk_index, in_base, " at file offset ",
                   chunk.file_offset(), ": ", st.message()));
}

absl::StatusOr<uint64_t> ManifestChecksumOf(io::FileSystem* fs,
                                            const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<io::ReadableFile> file,
                   fs->NewReadableFile(path, {}));
  ASSIGN_OR_RETURN(const uint64_t size, file->Size());
  ASSIGN_OR_RETURN(Footer footer, ReadFooter(file.get(), size));
  return footer.manifest_xxh3;
}

std::vector<absl::Status> VerifyShard(io::FileSystem* fs,
                                      const std::string& path,
                                      const ShardReaderOptions& options) {
  absl::StatusOr<std::unique_ptr<ShardReader>> reader =
      ShardReader::Open(fs, path, options);
  if (!reader.ok()) return {reader.status()};
  return (*reader)->VerifyAll();
}

std::vector<absl::Status> VerifyRawItem(absl::Span<const uint8_t> raw,
                                        const proto::Item& item,
                                        size_t max_errors) {
  std::vector<absl::Status> errors;
  if (raw.size() != item.raw_size()) {
    errors.push_back(absl::DataLossError(
        absl::StrCat("item \"", item.name(), "\" has ", raw.size(),
                     " bytes here but ", item.raw_size(), " in the manifest")));
    return errors;
  }
  for (int c = 0; c < item.chunks_size() && errors.size() < max_errors; ++c) {
    const proto::ChunkInfo& chunk = item.chunks(c);
    if (chunk.raw_offset() > raw.size() ||
        chunk.raw_size() > raw.size() - chunk.raw_offset()) {
      errors.push_back(absl::DataLossError(
          absl::StrCat("chunk ", c, " of item \"", item.name(),
                       "\" lies outside the item")));
    } else if (Checksum(raw.subspan(chunk.raw_offset(), chunk.raw_size())) !=
               chunk.raw_xxh3()) {
      errors.push_back(absl::DataLossError(absl::StrCat(
          "item \"", item.name(), "\" chunk ", c, " (raw bytes ",
          chunk.raw_offset(), "..", chunk.raw_offset() + chunk.raw_size(),
          "): raw checksum mismatch")));
    }
  }
  return errors;
}

}  // namespace ckpt::snapshot
