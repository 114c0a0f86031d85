// FileSystemWrapper: a FileSystem that passes every call to another one;
// subclasses override only what they change (as RocksDB's FileSystemWrapper).
//
// Thread-safety: as the wrapped file system's.
#ifndef CKPT_IO_FILE_SYSTEM_WRAPPER_H_
#define CKPT_IO_FILE_SYSTEM_WRAPPER_H_

#include <memory>
#include <string>
#include <vector>

#include "io/file_system.h"

namespace ckpt::io {

class FileSystemWrapper : public FileSystem {
 public:
  // `base` must outlive this object.
  explicit FileSystemWrapper(FileSystem* base) : base_(base) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const FileOptions& options) override {
    return base_->NewWritableFile(path, options);
  }
  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(
      const std::string& path, const FileOptions& options) override {
    return base_->NewReadableFile(path, options);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  absl::Status HardLink(const std::string& existing,
                        const std::string& link) override {
    return base_->HardLink(existing, link);
  }
  absl::Status SyncDir(const std::string& dir) override {
    return base_->SyncDir(dir);
  }
  absl::Status Unlink(const std::string& path) override {
    return base_->Unlink(path);
  }
  absl::Status CreateDirs(const std::string& path) override {
    return base_->CreateDirs(path);
  }
  absl::Status CreatePrivateDirs(const std::string& path) override {
    return base_->CreatePrivateDirs(path);
  }
  absl::Status RemoveDir(const std::string& path) override {
    return base_->RemoveDir(path);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override {
    return base_->ListDir(dir);
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    return base_->FileSize(path);
  }
  absl::StatusOr<FileId> GetFileId(const std::string& path) override {
    return base_->GetFileId(path);
  }
  absl::StatusOr<bool> InUse(const std::string& path) override {
    return base_->InUse(path);
  }
  absl::StatusOr<bool> Exists(const std::string& path) override {
    return base_->Exists(path);
  }
  absl::StatusOr<uint64_t> FreeSpace(const std::string& path) override {
    return base_->FreeSpace(path);
  }
  absl::StatusOr<std::unique_ptr<MappedFile>> MapFile(
      const std::string& path, const MapOptions& options) override {
    return base_->MapFile(path, options);
  }
  absl::StatusOr<UniqueFd> OpenForWritingInPlace(
      const std::string& path) override {
    return base_->OpenForWritingInPlace(path);
  }

 protected:
  FileSystem* base() const { return base_; }

 private:
  FileSystem* const base_;
};

}  // namespace ckpt::io

#endif  // CKPT_IO_FILE_SYSTEM_WRAPPER_H_
