// The open files of the POSIX file system: see posix_file.h.
#include "io/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/errno_status.h"
#include "io/file_system.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "io/uring_engine.h"

namespace ckpt::io::internal {

absl::Status PosixError(absl::string_view op, absl::string_view path) {
  return ErrnoToStatus(errno, absl::StrCat(op, " ", path));
}

int OpenMaybeDirect(const std::string& path, int flags, bool direct,
                    bool* is_direct) {
  int fd = -1;
  *is_direct = false;
  if (direct) {
    do {
      fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0) {
      *is_direct = true;
      return fd;
    }
    if (errno != EINVAL) return -1;
  }
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

FileId IdOf(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

namespace {

absl::Status PwriteFully(int fd, const std::string& path, const uint8_t* buf,
                         size_t n, uint64_t offset) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, buf, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoToStatus(errno,
                           absl::StrCat("write ", path, " at offset ", offset));
    }
    if (w == 0) {
      return absl::InternalError(
          absl::StrCat("write ", path, " at offset ", offset, ": no progress"));
    }
    buf += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status PreadFully(int fd, const std::string& path, uint8_t* buf, size_t n,
                        uint64_t offset) {
  while (n > 0) {
    ssize_t r = ::pread(fd, buf, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return ErrnoToStatus(errno,
                           absl::StrCat("read ", path, " at offset ", offset));
    }
    if (r == 0) {
      return absl::OutOfRangeError(absl::StrCat("read ", path, " at offset ",
                                                offset, ": end of file with ",
                                                n, " bytes left"));
    }
    buf += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

std::unique_ptr<UringEngine> MaybeEngine(const PosixFsOptions& options) {
  if (!options.use_io_uring || !IoUringAvailable()) return nullptr;
  auto engine = UringEngine::Create(
      UringEngineOptions{options.queue_depth, options.uring_fault_hook});
  if (!engine.ok()) {
    CKPT_LOG_WARN("io_uring unavailable for this file ({}); using pwrite/pread",
                  engine.status().ToString());
    return nullptr;
  }
  return std::move(engine).value();
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd, bool direct,
                    const PosixFsOptions& options)
      : path_(std::move(path)),
        fd_(fd),
        direct_(direct),
        options_(options),
        engine_(MaybeEngine(options)) {}

  ~PosixWritableFile() override {
    absl::Status s = Close();
    if (!s.ok()) CKPT_LOG_WARN("closing {}: {}", path_, s.ToString());
  }

  absl::Status Write(uint64_t offset, AlignedBuffer buffer) override {
    // The buffer lives until all of its requests completed.
    auto holder = std::make_shared<AlignedBuffer>(std::move(buffer));
    return Submit(offset, holder->span(), holder);
  }

  absl::Status WriteBorrowed(uint64_t offset,
                             absl::Span<const uint8_t> bytes) override {
    return Submit(offset, bytes, nullptr);
  }

  absl::Status Flush() override {
    if (engine_ != nullptr) {
      absl::Status s = engine_->Drain();
      if (!s.ok() && error_.ok()) error_ = s;
    }
    return error_;
  }

  absl::Status Allocate(uint64_t size) override {
    RETURN_IF_ERROR(error_);
    if (size == 0) return absl::OkStatus();
    int rc;
    do {
      rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(size));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
      error_ = ErrnoToStatus(
          errno, absl::StrCat("fallocate ", path_, " to ", size, " bytes"));
    }
    return error_;
  }

  absl::Status Truncate(uint64_t size) override {
    RETURN_IF_ERROR(Flush());
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      error_ = ErrnoToStatus(
          errno, absl::StrCat("ftruncate ", path_, " to ", size, " bytes"));
    }
    return error_;
  }

  absl::Status Sync() override { return SyncImpl(false); }
  absl::Status DataSync() override { return SyncImpl(true); }

  absl::Status Close() override {
    if (fd_ < 0) return error_;
    absl::Status s = Flush();
    engine_.reset();
    if (::close(fd_) != 0 && s.ok()) s = PosixError("close", path_);
    fd_ = -1;
    if (!s.ok() && error_.ok()) error_ = s;
    return error_;
  }

  const std::string& path() const override { return path_; }

 private:
  // Writes `bytes` at `offset`, through io_uring when there is one; `keep`
  // (may be null) owns them and is held until the last request completed.
  absl::Status Submit(uint64_t offset, absl::Span<const uint8_t> bytes,
                      std::shared_ptr<AlignedBuffer> keep) {
    RETURN_IF_ERROR(error_);
    if (fd_ < 0)
      return absl::FailedPreconditionError(
          absl::StrCat("write to closed ", path_));
    if (direct_ && (!IsAligned(offset) || !IsAligned(bytes.size()) ||
                    !IsAligned(reinterpret_cast<uintptr_t>(bytes.data())))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "O_DIRECT write to ", path_, " at offset ", offset, " of ",
          bytes.size(), " bytes is not aligned to ", kDirectIoAlignment));
    }
    if (engine_ == nullptr) {
      error_ = PwriteFully(fd_, path_, bytes.data(), bytes.size(), offset);
      return error_;
    }
    const size_t total = bytes.size();
    for (size_t pos = 0; pos < total; pos += options_.max_request_bytes) {
      size_t len = std::min(options_.max_request_bytes, total - pos);
      absl::Status s =
          engine_->SubmitWrite(fd_, &path_, bytes.data() + pos, len,
                               offset + pos, [this, keep](absl::Status status) {
                                 if (!status.ok() && error_.ok())
                                   error_ = std::move(status);
                               });
      if (!s.ok()) {
        if (error_.ok()) error_ = s;
        break;
      }
    }
    return error_;
  }

  absl::Status SyncImpl(bool data_only) {
    RETURN_IF_ERROR(Flush());
    if (fd_ < 0)
      return absl::FailedPreconditionError(
          absl::StrCat("sync of closed ", path_));
    int rc = data_only ? ::fdatasync(fd_) : ::fsync(fd_);
    if (rc != 0) {
      // Never retried: after a failed fsync the kernel may have dropped the
      // dirty pages.
      error_ = PosixError(data_only ? "fdatasync" : "fsync", path_);
    }
    return error_;
  }

  const std::string path_;
  int fd_;
  const bool direct_;
  const PosixFsOptions options_;
  std::unique_ptr<UringEngine> engine_;
  absl::Status error_;
};

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(std::string path, int fd, bool direct,
                    const PosixFsOptions& options)
      : path_(std::move(path)),
        fd_(fd),
        direct_(direct),
        options_(options),
        engine_(MaybeEngine(options)) {}
  ~PosixReadableFile() override {
    engine_.reset();  // drains
    ::close(fd_);
  }

  absl::Status Read(uint64_t offset, absl::Span<uint8_t> dst) override {
    RETURN_IF_ERROR(CheckAlignment(offset, dst));
    return PreadFully(fd_, path_, dst.data(), dst.size(), offset);
  }

  absl::Status ReadAsync(uint64_t offset, absl::Span<uint8_t> dst,
                         ReadCallback done) override {
    RETURN_IF_ERROR(CheckAlignment(offset, dst));
    if (engine_ == nullptr || dst.empty()) {
      done(PreadFully(fd_, path_, dst.data(), dst.size(), offset));
      return absl::OkStatus();
    }
    // One callback for the whole read, after every request of it completed.
    struct Joint {
      size_t remaining;
      absl::Status first_error;
      ReadCallback done;
    };
    const size_t step = options_.max_request_bytes;
    auto joint = std::make_shared<Joint>(
        Joint{(dst.size() + step - 1) / step, {}, std::move(done)});
    for (size_t pos = 0; pos < dst.size(); pos += step) {
      size_t len = std::min(step, dst.size() - pos);
      absl::Status s =
          engine_->SubmitRead(fd_, &path_, dst.data() + pos, len, offset + pos,
                              [joint](absl::Status status) {
                                if (!status.ok() && joint->first_error.ok()) {
                                  joint->first_error = std::move(status);
                                }
                                if (--joint->remaining == 0) {
                                  joint->done(joint->first_error);
                                }
                              });
      if (!s.ok()) {
        // Requests not submitted never complete: account for them here.
        size_t unsent = (dst.size() - pos + step - 1) / step;
        if (joint->first_error.ok()) joint->first_error = s;
        joint->remaining -= unsent;
        if (joint->remaining == 0) joint->done(joint->first_error);
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

  absl::Status WaitAny() override {
    return engine_ == nullptr ? absl::OkStatus() : engine_->WaitAny();
  }

  absl::Status ReadQueued(uint64_t offset, absl::Span<uint8_t> dst) override {
    return ReadAsync(offset, dst, [this](absl::Status status) {
      if (!status.ok() && error_.ok()) error_ = std::move(status);
    });
  }

  absl::Status WaitReads() override {
    if (engine_ != nullptr) {
      absl::Status s = engine_->Drain();
      if (!s.ok() && error_.ok()) error_ = s;
    }
    return std::exchange(error_, absl::OkStatus());
  }

  absl::StatusOr<uint64_t> Size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return PosixError("fstat", path_);
    return static_cast<uint64_t>(st.st_size);
  }

  const std::string& path() const override { return path_; }

 private:
  absl::Status CheckAlignment(uint64_t offset, absl::Span<uint8_t> dst) const {
    if (direct_ && (!IsAligned(offset) || !IsAligned(dst.size()) ||
                    !IsAligned(reinterpret_cast<uintptr_t>(dst.data())))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "O_DIRECT read of ", path_, " at offset ", offset, " of ", dst.size(),
          " bytes is not aligned to ", kDirectIoAlignment));
    }
    return absl::OkStatus();
  }

  const std::string path_;
  const int fd_;
  const bool direct_;
  const PosixFsOptions options_;
  std::unique_ptr<UringEngine> engine_;
  absl::Status error_;
};

// Keeps the file open (one descriptor) so that Linked() can ask fstat.
class PosixMappedFile final : public MappedFile {
 public:
  PosixMappedFile(std::string path, int fd, FileId id, uint8_t* data,
                  size_t size)
      : path_(std::move(path)), fd_(fd), id_(id), data_(data), size_(size) {}
  ~PosixMappedFile() override {
    if (data_ != nullptr) ::munmap(data_, size_);
    ::close(fd_);
  }
  uint8_t* data() override { return data_; }
  size_t size() const override { return size_; }
  const std::string& path() const override { return path_; }
  FileId id() const override { return id_; }
  absl::StatusOr<bool> Linked() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return PosixError("fstat", path_);
    return st.st_nlink > 0;
  }
  absl::Status Reserve(uint64_t offset, uint64_t length) override {
    if (offset > size_ || length > size_ - offset) {
      return absl::OutOfRangeError(absl::StrCat("reserve bytes ", offset,
                                                " to ", offset + length, " of ",
                                                path_, ", of ", size_));
    }
    if (length == 0) return absl::OkStatus();
    const int rc = ::posix_fallocate(fd_, static_cast<off_t>(offset),
                                     static_cast<off_t>(length));
    if (rc != 0) {
      return ErrnoToStatus(rc, absl::StrCat("allocate bytes ", offset, " to ",
                                            offset + length, " of ", path_));
    }
    // The pages mapped in at once (a fault each otherwise); kernels before
    // 5.14 lack it and fault them in as they are written.
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t begin = offset / page * page;
    const uint64_t end =
        std::min<uint64_t>((offset + length + page - 1) / page * page, size_);
    if (::madvise(data_ + begin, end - begin, kMadvPopulateWrite) != 0 &&
        errno != EINVAL) {
      return PosixError("populate mapping of", path_);
    }
    return absl::OkStatus();
  }

 private:
  const std::string path_;
  const int fd_;
  const FileId id_;
  uint8_t* const data_;
  const size_t size_;
};

}  // namespace

std::unique_ptr<WritableFile> NewPosixWritableFile(
    std::string path, int fd, bool direct, const PosixFsOptions& options) {
  return std::make_unique<PosixWritableFile>(std::move(path), fd, direct,
                                             options);
}

std::unique_ptr<ReadableFile> NewPosixReadableFile(
    std::string path, int fd, bool direct, const PosixFsOptions& options) {
  return std::make_unique<PosixReadableFile>(std::move(path), fd, direct,
                                             options);
}

std::unique_ptr<MappedFile> NewPosixMappedFile(std::string path, int fd,
                                               FileId id, uint8_t* data,
                                               size_t size) {
  return std::make_unique<PosixMappedFile>(std::move(path), fd, id, data, size);
}

}  // namespace ckpt::io::internal
