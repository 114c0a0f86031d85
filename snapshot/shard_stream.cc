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
  // Compressed chunks are decoded on `pool` while the next ones arrive, each
  // from one of a few buffers.
  const size_t buffers = pool != nullptr ? 2 * pool->size() + 2 : 1;
  std::vector<std::vector<uint8_t>> stored(buffers);
  absl::Mutex mu;
  std::vector<bool> busy(buffers, false);  // guarded by mu
  absl::Status decode_error;               // guarded by mu
  auto acquire = [&]() {
    absl::MutexLock lock(&mu);
    size_t free = 0;
    auto found = [&]() {
      free = std::find(busy.begin(), busy.end(), false) - busy.begin();
      return free < busy.size();
    };
    mu.Await(absl::Condition(&found));
    busy[free] = true;
    return free;
  };
  auto drain = [&]() {
    absl::MutexLock lock(&mu);
    auto idle = [&]() {
      return std::find(busy.begin(), busy.end(), true) == busy.end();
    };
    mu.Await(absl::Condition(&idle));
    return decode_error;
  };

  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash(
      XXH3_createState(), &XXH3_freeState);
  std::vector<uint8_t> padding(kAlignment);
  uint8_t header_bytes[kChunkHeaderSize];
  absl::Status failed;
  for (int i = 0; i < manifest.items_size() && failed.ok(); ++i) {
    const proto::Item& item = manifest.items(i);
    for (int c = 0; c < item.chunks_size() && failed.ok(); ++c) {
      const proto::ChunkInfo& chunk = item.chunks(c);
      auto where = [&item, &chunk, c](const absl::Status& s) {
        return absl::Status(s.code(),
                            absl::StrCat("item \"", item.name(), "\" chunk ", c,
                                         " (file offset ", chunk.file_offset(),
                                         "): ", s.message()));
      };
      absl::Status s = read(absl::MakeSpan(header_bytes));
      absl::StatusOr<ChunkHeader> header =
          s.ok() ? DecodeChunkHeader(absl::MakeConstSpan(header_bytes))
                 : absl::StatusOr<ChunkHeader>(s);
      if (!header.ok()) {
        failed = where(header.status());
        break;
      }
      if (!(*header == HeaderFor(chunk, static_cast<uint32_t>(i),
                                 static_cast<uint32_t>(c),
                                 manifest.format_version()))) {
        failed = where(absl::DataLossError("header differs from the manifest"));
        break;
      }
      // Zero padding between the header and the stored bytes (a chunk stored
      // in place).
      const size_t gap = header->stored_offset - kChunkHeaderSize;
      s = read(absl::MakeSpan(padding.data(), gap));
      if (s.ok() && !AllZero(padding.data(), gap)) {
        s = absl::DataLossError("nonzero padding after the header");
      }
      absl::Span<uint8_t> dst =
          items[i].subspan(chunk.raw_offset(), chunk.raw_size());
      if (!s.ok()) {
        // Reported below.
      } else if (chunk.codec() == proto::CODEC_NONE &&
                 chunk.filter() == proto::FILTER_NONE) {
        // Stored bytes are the raw bytes: straight into place.
        XXH3_64bits_reset(hash.get());
        for (size_t at = 0; at < dst.size() && s.ok();) {
          const size_t n = std::min(kPiece, dst.size() - at);
          s = read(dst.subspan(at, n));
          if (s.ok()) XXH3_64bits_update(hash.get(), dst.data() + at, n);
          at += n;
        }
        if (s.ok()) {
          const uint64_t sum = XXH3_64bits_digest(hash.get());
          if (sum != chunk.raw_xxh3() || sum != chunk.stored_xxh3()) {
            s = absl::DataLossError("checksum mismatch");
          }
        }
      } else {
        const size_t b = acquire();
        stored[b].resize(chunk.stored_size());
        s = read(absl::MakeSpan(stored[b]));
        if (!s.ok()) {
          absl::MutexLock lock(&mu);
          busy[b] = false;
        } else {
          auto decode = [&, b, h = *header, dst, where] {
            absl::Status d = DecodeChunk(h, stored[b], dst);
            absl::MutexLock lock(&mu);
            if (!d.ok() && decode_error.ok()) decode_error = where(d);
            busy[b] = false;
          };
          if (pool != nullptr) {
            pool->Schedule(decode);
          } else {
            decode();
          }
        }
      }
      if (s.ok()) {
        const size_t pad =
            ChunkFootprint(header->stored_offset, chunk.stored_size()) -
            header->stored_offset - chunk.stored_size();
        s = read(absl::MakeSpan(padding.data(), pad));
        if (s.ok() && !AllZero(padding.data(), pad)) {
          s = absl::DataLossError("nonzero padding");
        }
      }
      if (!s.ok()) failed = where(s);
    }
  }
  // Every decode is done before the buffers and destinations go away.
  const absl::Status decoded = drain();
  RETURN_IF_ERROR(failed);
  RETURN_IF_ERROR(decoded);
  // The tail: the manifest the routing used, zero padding, the footer.
  std::vector<uint8_t> tail(file_size - manifest.data_size());
  RETURN_IF_ERROR(read(absl::MakeSpan(tail)));
  if (std::memcmp(tail.data(), manifest_bytes.data(), manifest_bytes.size()) !=
          0 ||
      !AllZero(tail.data() + manifest_bytes.size(),
               tail.size() - manifest_bytes.size() - kFooterSize)) {
    return absl::DataLossError(
        "the file's manifest differs from the one it was offered with");
  }
  ASSIGN_OR_RETURN(Footer footer,
                   DecodeFooter(absl::MakeConstSpan(tail).subspan(
                       tail.size() - kFooterSize)));
  if (footer.version != manifest.format_version() ||
      footer.manifest_offset != manifest.data_size() ||
      footer.manifest_size != manifest_bytes.size() ||
      footer.file_size != file_size ||
      footer.manifest_xxh3 !=
          Checksum({reinterpret_cast<const uint8_t*>(manifest_bytes.data()),
                    manifest_bytes.size()})) {
    return absl::DataLossError("the footer does not match the manifest");
  }
  return absl::OkStatus();
}

}  // namespace ckpt::snapshot
