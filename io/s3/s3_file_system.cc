#include "io/s3/s3_file_system.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "io/parallel.h"
#include "io/s3/s3_upload.h"
#include "io/status_macros.h"
#include "io/threaded_readable_file.h"

namespace ckpt::io::s3 {
namespace {

constexpr absl::string_view kScheme = "s3://";

struct ObjectPath {
  std::string bucket;
  std::string key;  // no leading '/'
};

absl::StatusOr<ObjectPath> Split(absl::string_view path) {
  absl::string_view rest = path;
  if (!absl::ConsumePrefix(&rest, kScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", path, "\" is not an s3://bucket/key path"));
  }
  const size_t slash = rest.find('/');
  ObjectPath out{std::string(rest.substr(0, slash)), ""};
  if (slash != absl::string_view::npos) {
    absl::string_view key = rest.substr(slash + 1);
    while (absl::ConsumeSuffix(&key, "/")) {
    }
    out.key = std::string(key);
  }
  if (out.bucket.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", path, "\" names no bucket"));
  }
  return out;
}

absl::Status Unsupported(absl::string_view what, absl::string_view path) {
  return absl::UnimplementedError(
      absl::StrCat(path, ": an object store has no ", what));
}

// An object read by ranges into the caller's buffers: a large read as ranges
// fetched at once; queued and asynchronous reads on threads of the file's
// own, `concurrency` at a time (io/threaded_readable_file.h).
class S3ReadableFile : public ThreadedReadableFile {
 public:
  S3ReadableFile(S3Client* client, std::string path, ObjectPath object,
                 uint64_t size, uint64_t range_bytes, int concurrency)
      : ThreadedReadableFile(concurrency),
        client_(client),
        path_(std::move(path)),
        object_(std::move(object)),
        size_(size),
        range_bytes_(std::max<uint64_t>(range_bytes, 1)),
        concurrency_(std::max(1, concurrency)) {}
  ~S3ReadableFile() override { StopReads(); }

  absl::Status Read(uint64_t offset, absl::Span<uint8_t> dst) override {
    if (offset > size_ || dst.size() > size_ - offset) {
      return absl::OutOfRangeError(absl::StrCat(path_, ": bytes ", offset,
                                                " to ", offset + dst.size(),
                                                " of an object of ", size_));
    }
    const size_t pieces = (dst.size() + range_bytes_ - 1) / range_bytes_;
    if (pieces <= 1) {
      return client_->GetRange(object_.bucket, object_.key, offset, dst);
    }
    std::vector<absl::Status> got(pieces);
    ParallelFor(pieces, concurrency_, [&](size_t i) {
      const uint64_t at = i * range_bytes_;
      got[i] = client_->GetRange(
          object_.bucket, object_.key, offset + at,
          dst.subspan(at, std::min<uint64_t>(range_bytes_, dst.size() - at)));
    });
    for (absl::Status& s : got) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size() override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  S3Client* const client_;
  const std::string path_;
  const ObjectPath object_;
  const uint64_t size_;
  const uint64_t range_bytes_;
  const int concurrency_;
};

}  // namespace

S3FileSystem::S3FileSystem(std::shared_ptr<S3Client> client,
                           S3FileSystemOptions options)
    : client_(std::move(client)), options_(options) {}

bool S3FileSystem::IsS3Path(absl::string_view path) {
  return absl::StartsWith(path, kScheme);
}

absl::StatusOr<std::unique_ptr<WritableFile>> S3FileSystem::NewWritableFile(
    const std::string& path, const FileOptions&) {
  ASSIGN_OR_RETURN(ObjectPath o, Split(path));
  return std::unique_ptr<WritableFile>(
      new S3Upload(client_.get(), path, o.bucket, o.key, options_.part_bytes,
                   options_.concurrency));
}

absl::StatusOr<std::unique_ptr<ReadableFile>> S3FileSystem::NewReadableFile(
    const std::string& path, const FileOptions&) {
  ASSIGN_OR_RETURN(ObjectPath o, Split(path));
  ASSIGN_OR_RETURN(ObjectInfo info, client_->HeadObject(o.bucket, o.key));
  return std::unique_ptr<ReadableFile>(
      new S3ReadableFile(client_.get(), path, std::move(o), info.size,
                         options_.range_bytes, options_.concurrency));
}

absl::Status S3FileSystem::Rename(const std::string& from, const std::string&) {
  return Unsupported("rename", from);
}

absl::Status S3FileSystem::HardLink(const std::string& existing,
                                    const std::string&) {
  return Unsupported("links", existing);
}

absl::Status S3FileSystem::SyncDir(const std::string& dir) {
  return Split(dir).status();
}

absl::Status S3FileSystem::Unlink(const std::string& path) {
  ASSIGN_OR_RETURN(ObjectPath o, Split(path));
  return client_->DeleteObject(o.bucket, o.key);
}

absl::Status S3FileSystem::CreateDirs(const std::string& path) {
  return Split(path).status();
}

absl::Status S3FileSystem::CreatePrivateDirs(const std::string& path) {
  return Split(path).status();
}

absl::Status S3FileSystem::RemoveDir(const std::string& path) {
  return Split(path).status();
}

absl::StatusOr<std::vector<std::string>> S3FileSystem::ListDir(
    const std::string& dir) {
  ASSIGN_OR_RETURN(ObjectPath o, Split(dir));
  ASSIGN_OR_RETURN(
      S3Client::Level level,
      client_->ListLevel(o.bucket, o.key.empty() ? "" : o.key + "/"));
  std::vector<std::string> names = std::move(level.directories);
  for (ObjectInfo& object : level.objects) {
    if (!object.key.empty()) names.push_back(std::move(object.key));
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

absl::StatusOr<uint64_t> S3FileSystem::FileSize(const std::string& path) {
  ASSIGN_OR_RETURN(ObjectPath o, Split(path));
  ASSIGN_OR_RETURN(ObjectInfo info, client_->HeadObject(o.bucket, o.key));
  return info.size;
}

absl::StatusOr<FileId> S3FileSystem::GetFileId(const std::string& path) {
  return Unsupported("file ids", path);
}

absl::StatusOr<bool> S3FileSystem::InUse(const std::string& path) {
  RETURN_IF_ERROR(Split(path).status());
  return false;  // objects are never written over in place
}

absl::StatusOr<bool> S3FileSystem::Exists(const std::string& path) {
  ASSIGN_OR_RETURN(ObjectPath o, Split(path));
  absl::StatusOr<ObjectInfo> info = client_->HeadObject(o.bucket, o.key);
  if (absl::IsNotFound(info.status())) return false;
  RETURN_IF_ERROR(info.status());
  return true;
}

absl::StatusOr<uint64_t> S3FileSystem::FreeSpace(const std::string& path) {
  RETURN_IF_ERROR(Split(path).status());
  return std::numeric_limits<uint64_t>::max();
}

absl::StatusOr<std::unique_ptr<MappedFile>> S3FileSystem::MapFile(
    const std::string& path, const MapOptions&) {
  return Unsupported("mappings", path);
}

absl::StatusOr<UniqueFd> S3FileSystem::OpenForWritingInPlace(
    const std::string& path) {
  return Unsupported("writing in place", path);
}

}  // namespace ckpt::io::s3
