// ShardReader opens a committed shard file and reads items back, verifying
// everything it touches: the footer and manifest checksums and structure on
// Open(), and for every chunk read its header (which must match the manifest),
// zero padding, stored and raw checksums. Reads are queued through
// io::FileSystem (io_uring, O_DIRECT) a window at a time and decoded in
// parallel. Every error names the file, and where it applies the item, chunk
// and file offset.
//
// Thread-safety: one thread at a time.
#ifndef CKPT_SNAPSHOT_SHARD_READER_H_
#define CKPT_SNAPSHOT_SHARD_READER_H_

#include <cstdint>
#include <memory>
#include <string>
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
  // Bytes of chunks read ahead while the previous window is decoded. Keep it at
  // most half of what the file system keeps in flight (queue depth x request
  // size, 16 MiB by default), so queueing the next window never waits for the
  // disk.
  size_t read_window_bytes = 8 << 20;
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
  // Reads bytes [offset, offset + out.size()) of an item, decoding only the
  // chunks that overlap.
  absl::Status ReadItemRange(absl::string_view name, uint64_t offset,
                             absl::Span<uint8_t> out);
  // Checks every chunk; returns one error per bad chunk (empty when the shard
  // is intact).
  std::vector<absl::Status> VerifyAll();

 private:
  struct Piece;  // one chunk to read and where its bytes go
  ShardReader(std::string path, std::unique_ptr<io::ReadableFile> file,
              const ShardReaderOptions& options);
  absl::Status LoadManifest();
  // Reads and decodes `pieces`; stops at the first error unless `errors`
  // collects them.
  absl::Status ReadPieces(std::vector<Piece>& pieces,
                          std::vector<absl::Status>* errors);
  absl::Status DecodePiece(const Piece& piece, const uint8_t* chunk_bytes);
  io::ThreadPool* pool();

  const std::string path_;
  std::unique_ptr<io::ReadableFile> file_;
  const ShardReaderOptions options_;
  std::unique_ptr<io::ThreadPool> own_pool_;
  std::unique_ptr<io::BufferPool>
      buffers_;  // chunk-sized read buffers, reused across windows
  proto::ShardManifest manifest_;
  std::string manifest_bytes_;
  uint64_t file_size_ = 0;
};

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
