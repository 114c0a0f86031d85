// S3FileSystem: io::FileSystem over S3, so that what reads and writes shard
// files (ShardReader, a self-contained view reading an increment's bases
// beside it, WriteSelfContained, the shared tier's copies and pins, the
// operators' tools) works on an object store unchanged. A path is
// "s3://bucket/key"; a directory is a key prefix, there as soon as a key
// under it is (CreateDirs and SyncDir do nothing).
//
// Reads are ranged GETs straight into the caller's buffer, a read of more
// than `range_bytes` split into ranges fetched at once (`concurrency`). A
// written file is sent as a multipart upload of `part_bytes` parts, up to
// `concurrency` of them in flight, and appears whole at Close() and not
// before (an object is never seen partly written, so no temporary name and
// rename are needed); a file destroyed before Close() is aborted. What S3
// cannot do (rename, links, mappings, writes out of order, locks) is
// Unimplemented, naming the path.
//
// Thread-safety: the file system is thread-safe; each file is used by one
// thread at a time.
#ifndef CKPT_IO_S3_S3_FILE_SYSTEM_H_
#define CKPT_IO_S3_S3_FILE_SYSTEM_H_

#include <memory>
#include <string>
#include <vector>

#include "io/file_system.h"
#include "io/s3/s3_client.h"

namespace ckpt::io::s3 {

struct S3FileSystemOptions {
  uint64_t part_bytes = 16 << 20;  // at least S3's 5 MiB
  uint64_t range_bytes = 8 << 20;
  int concurrency = 8;
};

class S3FileSystem : public FileSystem {
 public:
  explicit S3FileSystem(std::shared_ptr<S3Client> client,
                        S3FileSystemOptions options = {});

  // Whether `path` is an s3:// path.
  static bool IsS3Path(absl::string_view path);

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const FileOptions& options) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(
      const std::string& path, const FileOptions& options) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status HardLink(const std::string& existing,
                        const std::string& link) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status Unlink(const std::string& path) override;
  absl::Status CreateDirs(const std::string& path) override;
  absl::Status CreatePrivateDirs(const std::string& path) override;
  absl::Status RemoveDir(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override;
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  absl::StatusOr<FileId> GetFileId(const std::string& path) override;
  absl::StatusOr<bool> InUse(const std::string& path) override;
  absl::StatusOr<bool> Exists(const std::string& path) override;
  absl::StatusOr<uint64_t> FreeSpace(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<MappedFile>> MapFile(
      const std::string& path, const MapOptions& options) override;
  absl::StatusOr<UniqueFd> OpenForWritingInPlace(
      const std::string& path) override;

  S3Client& client() { return *client_; }

 private:
  const std::shared_ptr<S3Client> client_;
  const S3FileSystemOptions options_;
};

}  // namespace ckpt::io::s3

#endif  // CKPT_IO_S3_S3_FILE_SYSTEM_H_
