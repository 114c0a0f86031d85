// The real file system: POSIX calls for metadata, io_uring (or pwrite/pread
// when the kernel refuses io_uring) for data.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "io/errno_status.h"
#include "io/file_system.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "io/uring_engine.h"

namespace ckpt::io {
namespace {

#ifdef MADV_POPULATE_WRITE
constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kMadvPopulateWrite = 23;  // Linux 5.14, older libc headers
#endif

absl::Status PosixError(absl::string_view op, absl::string_view path) {
  return ErrnoToStatus(errno, absl::StrCat(op, " ", path));
}

// Opens with O_DIRECT when asked, falling back to buffered I/O where the file
// system refuses it.
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

FileId IdOf(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

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

 private:
  const std::string path_;
  const int fd_;
  const FileId id_;
  uint8_t* const data_;
  const size_t size_;
};

class PosixFileSystem final : public FileSystem {
 public:
  explicit PosixFileSystem(const PosixFsOptions& options) : options_(options) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const FileOptions& options) override {
    bool direct = false;
    int fd = OpenMaybeDirect(
        path, O_WRONLY | O_CREAT | (options.truncate ? O_TRUNC : 0),
        options.direct, &direct);
    if (fd < 0) return PosixError("create", path);
    return std::make_unique<PosixWritableFile>(path, fd, direct, options_);
  }

  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(
      const std::string& path, const FileOptions& options) override {
    bool direct = false;
    int fd = OpenMaybeDirect(path, O_RDONLY, options.direct, &direct);
    if (fd < 0) return PosixError("open", path);
    absl::Status locked = LockForReading(fd, path);
    if (!locked.ok()) {
      ::close(fd);
      return locked;
    }
    return std::make_unique<PosixReadableFile>(path, fd, direct, options_);
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PosixError("rename", absl::StrCat(from, " to ", to));
    }
    return absl::OkStatus();
  }

  absl::Status HardLink(const std::string& existing,
                        const std::string& link) override {
    if (::link(existing.c_str(), link.c_str()) != 0) {
      return PosixError("link", absl::StrCat(existing, " to ", link));
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    int fd;
    do {
      fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return PosixError("open directory", dir);
    absl::Status s;
    if (::fsync(fd) != 0) s = PosixError("fsync directory", dir);
    ::close(fd);
    return s;
  }

  absl::Status Unlink(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("unlink", path);
    return absl::OkStatus();
  }

  absl::Status CreateDirs(const std::string& path) override {
    if (path.empty())
      return absl::InvalidArgumentError("create directory: empty path");
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return absl::OkStatus();
      return absl::AlreadyExistsError(absl::StrCat(
          "create directory ", path, ": exists and is not a directory"));
    }
    std::string parent = DirName(path);
    if (parent != path && parent != "." && parent != "/")
      RETURN_IF_ERROR(CreateDirs(parent));
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return PosixError("mkdir", path);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return PosixError("list directory", dir);
    std::vector<std::string> names;
    errno = 0;
    while (dirent* e = ::readdir(d)) {
      absl::string_view name(e->d_name);
      if (name != "." && name != "..") names.emplace_back(name);
    }
    int err = errno;
    ::closedir(d);
    if (err != 0)
      return ErrnoToStatus(err, absl::StrCat("read directory ", dir));
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("stat", path);
    return static_cast<uint64_t>(st.st_size);
  }

  absl::StatusOr<bool> Exists(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT) return false;
    return PosixError("stat", path);
  }

  absl::StatusOr<std::unique_ptr<MappedFile>> MapFile(
      const std::string& path, const MapOptions& options) override {
    const bool create = options.create_size > 0;
    int flags = (options.writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW;
    if (create) flags |= O_CREAT | O_EXCL;
    int fd;
    do {
      fd = ::open(path.c_str(), flags, options.mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return PosixError(create ? "create" : "open", path);
    uint64_t size = options.create_size;
    absl::Status s;
    struct stat st;
    if (::fstat(fd, &st) != 0) s = PosixError("fstat", path);
    // A read-only mapping is a reader's (a restore from a staging slot, ckpt
    // verify): it pins the file against reuse, as NewReadableFile does.
    if (s.ok() && !create && !options.writable) s = LockForReading(fd, path);
    if (!s.ok()) {
    } else if (create) {
      // posix_fallocate reserves tmpfs pages now, so running out of memory is
      // an error here rather than a SIGBUS when the slot is written.
      int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
      if (rc != 0)
        s = ErrnoToStatus(rc,
                          absl::StrCat("allocate ", size, " bytes for ", path));
    } else {
      size = static_cast<uint64_t>(st.st_size);
    }
    void* data = nullptr;
    if (s.ok() && size > 0) {
      const int prot = PROT_READ | (options.writable ? PROT_WRITE : 0);
      // A shared writable mapping is populated with MADV_POPULATE_WRITE: on
      // tmpfs pages reserved by fallocate it is about 3x faster than
      // MAP_POPULATE (measured: 1 GiB in ~0.3 s instead of ~1 s), which is
      // what a trainer's first save into a fresh slot pays. Kernels before 5.14
      // lack it (EINVAL) and take MAP_POPULATE.
      const bool populate_write = options.populate && options.writable;
      data = ::mmap(
          nullptr, size, prot,
          MAP_SHARED | (options.populate && !populate_write ? MAP_POPULATE : 0),
          fd, 0);
      if (data != MAP_FAILED && populate_write &&
          ::madvise(data, size, kMadvPopulateWrite) != 0) {
        if (errno == EINVAL) {
          ::munmap(data, size);
          data = ::mmap(nullptr, size, prot, MAP_SHARED | MAP_POPULATE, fd, 0);
        } else {
          s = PosixError("populate mapping of", path);
          ::munmap(data, size);
          data = nullptr;
        }
      }
      if (data == MAP_FAILED) {
        data = nullptr;
        s = PosixError("mmap", path);
      }
    }
    if (!s.ok()) {
      ::close(fd);
      if (create) ::unlink(path.c_str());
      return s;
    }
    return std::make_unique<PosixMappedFile>(path, fd, IdOf(st),
                                             static_cast<uint8_t*>(data), size);
  }

  absl::StatusOr<FileId> GetFileId(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return PosixError("lstat", path);
    return IdOf(st);
  }

  absl::StatusOr<bool> InUse(const std::string& path) override {
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return PosixError("open", path);
    const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    const int err = errno;
    ::close(fd);  // releases the probe's lock
    if (!free && err != EWOULDBLOCK) return ErrnoToStatus(err, "flock " + path);
    return !free;
  }

  absl::StatusOr<uint64_t> FreeSpace(const std::string& path) override {
    struct statvfs st;
    if (::statvfs(path.c_str(), &st) != 0) return PosixError("statvfs", path);
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }

 private:
  const PosixFsOptions options_;
};

}  // namespace

absl::Status LockForReading(int fd, const std::string& path) {
  // Not waited for: only InUse's probe takes the lock exclusively, and only
  // for a moment.
  (void)::flock(fd, LOCK_SH | LOCK_NB);
  // A file retired (renamed away to be written over) between the open and the
  // lock: this reader would read another shard's bytes.
  struct stat by_fd, by_path;
  if (::fstat(fd, &by_fd) != 0) return PosixError("fstat", path);
  if (::stat(path.c_str(), &by_path) != 0 || by_fd.st_ino != by_path.st_ino ||
      by_fd.st_dev != by_path.st_dev) {
    return absl::NotFoundError(
        absl::StrCat(path, " was removed while being opened"));
  }
  return absl::OkStatus();
}

bool IoUringAvailable() {
  static absl::once_flag once;
  static bool available = false;
  absl::call_once(once, [] {
    // Lets operators (and tests) take the path a kernel without io_uring takes.
    const char* disabled = std::getenv("CKPT_DISABLE_IO_URING");
    if (disabled != nullptr && *disabled != '\0' &&
        std::string_view(disabled) != "0") {
      CKPT_LOG_WARN(
          "io_uring disabled by CKPT_DISABLE_IO_URING; using pwrite/pread");
      return;
    }
    io_uring ring;
    int rc = io_uring_queue_init(2, &ring, 0);
    if (rc == 0) {
      available = true;
      io_uring_queue_exit(&ring);
    } else {
      CKPT_LOG_WARN(
          "io_uring is not available ({}); falling back to pwrite/pread",
          ErrnoToStatus(-rc, "io_uring_queue_init").ToString());
    }
  });
  return available;
}

std::unique_ptr<FileSystem> NewPosixFileSystem(const PosixFsOptions& options) {
  return std::make_unique<PosixFileSystem>(options);
}

FileSystem* DefaultFileSystem() {
  static FileSystem* fs = NewPosixFileSystem().release();
  return fs;
}

std::string DirName(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

std::string BaseName(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path
                                                      : path.substr(slash + 1));
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::StatusOr<std::string> ReadFileToString(FileSystem* fs,
                                             const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                   fs->NewReadableFile(path, {}));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  std::string out(size, '\0');
  RETURN_IF_ERROR(file->Read(
      0,
      absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(out.data()), out.size())));
  return out;
}

absl::Status WriteStringToFile(FileSystem* fs, const std::string& path,
                               absl::string_view contents) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   fs->NewWritableFile(path, {}));
  if (!contents.empty()) {
    AlignedBuffer buffer(contents.size());
    std::copy(contents.begin(), contents.end(), buffer.data());
    RETURN_IF_ERROR(file->Write(0, std::move(buffer)));
  }
  return file->Close();
}

}  // namespace ckpt::io
