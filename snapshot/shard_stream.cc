#include "snapshot/shard_stream.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "io/aligned_buffer.h"
#include "io/status_macros.h"
#include "io/thread_pool.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/format.h"
#include "snapshot/xxh3.h"

namespace ckpt::snapshot {
namespace {

// Raw bytes of an uncompressed chunk land in pieces this large, each hashed
// while it is still in the cache.
constexpr size_t kPiece = 1 << 20;

uint64_t TailSize(uint64_t manifest_size) {
  return io::AlignUp(manifest_size + kFooterSize);
}

bool AllZero(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}

// The few buffers compressed chunks are received into and decoded from on a
// pool while the next ones arrive; the first decode error.
class DecodeBuffers {
 public:
  explicit DecodeBuffers(size_t n) : stored_(n), busy_(n, false) {}

  // A free buffer's index, once there is one.
  size_t Acquire() {
    absl::MutexLock lock(&mu_);
    size_t free = 0;
    auto found = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      free = std::find(busy_.begin(), busy_.end(), false) - busy_.begin();
      return free < busy_.size();
    };
    mu_.Await(absl::Condition(&found));
    busy_[free] = true;
    return free;
  }
  std::vector<uint8_t>& buffer(size_t b) { return stored_[b]; }
  // Frees buffer `b`, noting `decoded` if it is the first error.
  void Release(size_t b, absl::Status decoded = absl::OkStatus()) {
    absl::MutexLock lock(&mu_);
    if (!decoded.ok() && error_.ok()) error_ = std::move(decoded);
    busy_[b] = false;
  }
  // Waits for every decode; the first error.
  absl::Status Drain() {
    absl::MutexLock lock(&mu_);
    auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::find(busy_.begin(), busy_.end(), true) == busy_.end();
    };
    mu_.Await(absl::Condition(&idle));
    return error_;
  }

 private:
  std::vector<std::vector<uint8_t>> stored_;  // each owned by its taker
  absl::Mutex mu_;
  std::vector<bool> busy_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

absl::Status CheckDestinations(const proto::ShardManifest& manifest,
                               const std::vector<absl::Span<uint8_t>>& items) {
  if (items.size() != static_cast<size_t>(manifest.items_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        items.size(), " destinations for ", manifest.items_size(), " items"));
  }
  for (int i = 0; i < manifest.items_size(); ++i) {
    if (items[i].size() != manifest.items(i).raw_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("item \"", manifest.items(i).name(), "\" has ",
                       manifest.items(i).raw_size(), " bytes, its destination ",
                       items[i].size()));
    }
  }
  return absl::OkStatus();
}

// One pass over a shard file's bytes in order, chunk after chunk, then the
// tail; every byte checked against the manifest.
class StreamReader {
 public:
  StreamReader(const StreamRead& read, uint64_t file_size,
               const proto::ShardManifest& manifest,
               const std::string& manifest_bytes,
               const std::vector<absl::Span<uint8_t>>& items,
               io::ThreadPool* pool)
      : read_(read),
        file_size_(file_size),
        manifest_(manifest),
        manifest_bytes_(manifest_bytes),
        items_(items),
        pool_(pool),
        buffers_(pool != nullptr ? 2 * pool->size() + 2 : 1),
        hash_(XXH3_createState(), &XXH3_freeState),
        padding_(kAlignment) {}

  absl::Status Run() {
    absl::Status failed = ReadChunks();
    // Every decode is done before the buffers and destinations go away.
    const absl::Status decoded = buffers_.Drain();
    RETURN_IF_ERROR(failed);
    RETURN_IF_ERROR(decoded);
    return ReadTail();
  }

 private:
  absl::Status ReadChunks() {
    for (int i = 0; i < manifest_.items_size(); ++i) {
      const proto::Item& item = manifest_.items(i);
      for (int c = 0; c < item.chunks_size(); ++c) {
        absl::Status s = ReadChunk(i, c);
        if (s.ok()) continue;
        return absl::Status(
            s.code(),
            absl::StrCat("item \"", item.name(), "\" chunk ", c,
                         " (file offset ", item.chunks(c).file_offset(),
                         "): ", s.message()));
      }
    }
    return absl::OkStatus();
  }

  // Header, zero gap, stored bytes (into place, or to a decode), padding.
  absl::Status ReadChunk(int i, int c) {
    const proto::ChunkInfo& chunk = manifest_.items(i).chunks(c);
    uint8_t header_bytes[kChunkHeaderSize];
    RETURN_IF_ERROR(read_(absl::MakeSpan(header_bytes)));
    ASSIGN_OR_RETURN(ChunkHeader header,
                     DecodeChunkHeader(absl::MakeConstSpan(header_bytes)));
    if (!(header == HeaderFor(chunk, static_cast<uint32_t>(i),
                              static_cast<uint32_t>(c),
                              manifest_.format_version()))) {
      return absl::DataLossError("header differs from the manifest");
    }
    // Zero padding between the header and the stored bytes (a chunk stored
    // in place).
    RETURN_IF_ERROR(ReadZeros(header.stored_offset - kChunkHeaderSize,
                              "nonzero padding after the header"));
    absl::Span<uint8_t> dst =
        items_[i].subspan(chunk.raw_offset(), chunk.raw_size());
    if (chunk.codec() == proto::CODEC_NONE &&
        chunk.filter() == proto::FILTER_NONE) {
      RETURN_IF_ERROR(ReadInPlace(chunk, dst));
    } else {
      RETURN_IF_ERROR(ReadAndDecode(i, c, header, dst));
    }
    return ReadZeros(ChunkFootprint(header.stored_offset, chunk.stored_size()) -
                         header.stored_offset - chunk.stored_size(),
                     "nonzero padding");
  }

  absl::Status ReadZeros(size_t n, const char* what) {
    RETURN_IF_ERROR(read_(absl::MakeSpan(padding_.data(), n)));
    if (!AllZero(padding_.data(), n)) return absl::DataLossError(what);
    return absl::OkStatus();
  }

  // Stored bytes are the raw bytes: straight into place, each piece hashed
  // while it is still in the cache.
  absl::Status ReadInPlace(const proto::ChunkInfo& chunk,
                           absl::Span<uint8_t> dst) {
    XXH3_64bits_reset(hash_.get());
    for (size_t at = 0; at < dst.size();) {
      const size_t n = std::min(kPiece, dst.size() - at);
      RETURN_IF_ERROR(read_(dst.subspan(at, n)));
      XXH3_64bits_update(hash_.get(), dst.data() + at, n);
      at += n;
    }
    const uint64_t sum = XXH3_64bits_digest(hash_.get());
    if (sum != chunk.raw_xxh3() || sum != chunk.stored_xxh3()) {
      return absl::DataLossError("checksum mismatch");
    }
    return absl::OkStatus();
  }

  // Into a free buffer, decoded into place on the pool (here without one).
  // A decode's error is reported by Run, naming its chunk.
  absl::Status ReadAndDecode(int i, int c, const ChunkHeader& header,
                             absl::Span<uint8_t> dst) {
    const proto::ChunkInfo& chunk = manifest_.items(i).chunks(c);
    const size_t b = buffers_.Acquire();
    std::vector<uint8_t>& stored = buffers_.buffer(b);
    stored.resize(chunk.stored_size());
    absl::Status s = read_(absl::MakeSpan(stored));
    if (!s.ok()) {
      buffers_.Release(b);
      return s;
    }
    auto decode = [this, b, header, dst, i, c] {
      absl::Status d = DecodeChunk(header, buffers_.buffer(b), dst);
      if (!d.ok()) {
        const proto::Item& item = manifest_.items(i);
        d = absl::Status(
            d.code(),
            absl::StrCat("item \"", item.name(), "\" chunk ", c,
                         " (file offset ", item.chunks(c).file_offset(),
                         "): ", d.message()));
      }
      buffers_.Release(b, std::move(d));
    };
    if (pool_ != nullptr) {
      pool_->Schedule(decode);
    } else {
      decode();
    }
    return absl::OkStatus();
  }

  // The tail: the manifest the routing used, zero padding, the footer.
  absl::Status ReadTail() {
    std::vector<uint8_t> tail(file_size_ - manifest_.data_size());
    RETURN_IF_ERROR(read_(absl::MakeSpan(tail)));
    if (std::memcmp(tail.data(), manifest_bytes_.data(),
                    manifest_bytes_.size()) != 0 ||
        !AllZero(tail.data() + manifest_bytes_.size(),
                 tail.size() - manifest_bytes_.size() - kFooterSize)) {
      return absl::DataLossError(
          "the file's manifest differs from the one it was offered with");
    }
    ASSIGN_OR_RETURN(Footer footer,
                     DecodeFooter(absl::MakeConstSpan(tail).subspan(
                         tail.size() - kFooterSize)));
    if (footer.version != manifest_.format_version() ||
        footer.manifest_offset != manifest_.data_size() ||
        footer.manifest_size != manifest_bytes_.size() ||
        footer.file_size != file_size_ ||
        footer.manifest_xxh3 !=
            Checksum({reinterpret_cast<const uint8_t*>(manifest_bytes_.data()),
                      manifest_bytes_.size()})) {
      return absl::DataLossError("the footer does not match the manifest");
    }
    return absl::OkStatus();
  }

  const StreamRead& read_;
  const uint64_t file_size_;
  const proto::ShardManifest& manifest_;
  const std::string& manifest_bytes_;
  const std::vector<absl::Span<uint8_t>>& items_;
  io::ThreadPool* const pool_;
  DecodeBuffers buffers_;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash_;
  std::vector<uint8_t> padding_;
};

}  // namespace

absl::StatusOr<proto::ShardManifest> ParseStreamManifest(
    const std::string& manifest_bytes, uint64_t file_size) {
  if (manifest_bytes.size() > kMaxManifestSize) {
    return absl::DataLossError(absl::StrCat(
        "manifest of ", manifest_bytes.size(), " bytes is over the limit"));
  }
  const uint64_t tail = TailSize(manifest_bytes.size());
  if (file_size < tail || file_size % kAlignment != 0) {
    return absl::DataLossError(absl::StrCat("a shard file of ", file_size,
                                            " bytes cannot hold a manifest of ",
                                            manifest_bytes.size(), " bytes"));
  }
  proto::ShardManifest manifest;
  if (!manifest.ParseFromString(manifest_bytes)) {
    return absl::DataLossError("the manifest does not parse");
  }
  RETURN_IF_ERROR(ValidateManifest(manifest, file_size - tail));
  return manifest;
}

absl::Status ReadShardStream(const StreamRead& read, uint64_t file_size,
                             const proto::ShardManifest& manifest,
                             const std::string& manifest_bytes,
                             const std::vector<absl::Span<uint8_t>>& items,
                             io::ThreadPool* pool) {
  RETURN_IF_ERROR(CheckDestinations(manifest, items));
  return StreamReader(read, file_size, manifest, manifest_bytes, items, pool)
      .Run();
}

}  // namespace ckpt::snapshot
