// io::FileSystem is the only route from ckpt to the file system, so tests can
// put a fault-injecting file system (FaultInjectionFs) in its place, the way
// leveldb's Env and rocksdb's FileSystem do.
//
// Files are written and read at explicit offsets. Writes and queued reads may
// complete asynchronously (the io_uring implementation keeps several in
// flight); Flush()/WaitReads() wait for them and return the first error. Every
// call returns absl::Status with a message that names the file and offset.
//
// Thread-safety: a FileSystem is thread-safe. A WritableFile or ReadableFile is
// used by one thread at a time.
#ifndef CKPT_IO_FILE_SYSTEM_H_
#define CKPT_IO_FILE_SYSTEM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "io/aligned_buffer.h"
#include "io/unique_fd.h"
#include "io/uring_fault.h"

namespace ckpt::io {

struct FileOptions {
  // O_DIRECT: offsets, lengths and buffer addresses must then be multiples of
  // kDirectIoAlignment. A file system that refuses O_DIRECT (tmpfs) silently
  // gets buffered I/O.
  bool direct = false;
  // NewWritableFile: truncate an existing file. Without, its blocks are kept
  // and written over (a recycled file: see ShardWriterOptions::recycle_from).
  bool truncate = true;
};

class WritableFile {
 public:
  virtual ~WritableFile() = default;

  // Queues a write of `buffer.span()` at `offset`. The file owns the buffer
  // until the write completes. An error may be returned here or by a later
  // Flush(); a file that failed once fails every later call with the first
  // error.
  virtual absl::Status Write(uint64_t offset, AlignedBuffer buffer) = 0;
  // Queues a write of bytes the caller owns (with O_DIRECT: an aligned
  // address, offset and size). They must stay valid and unchanged until
  // Flush(), Sync(), DataSync() or Close() returned; a failed write is reported
  // like Write's.
  virtual absl::Status WriteBorrowed(uint64_t offset,
                                     absl::Span<const uint8_t> bytes) = 0;
  // Waits for every queued write.
  virtual absl::Status Flush() = 0;
  // Reserves blocks for [0, size) and sets the file size to at least `size`, so
  // the writes that follow do not extend the file (ext4 serializes extending
  // O_DIRECT writes). A file system without fallocate makes this a no-op.
  virtual absl::Status Allocate(uint64_t size) = 0;
  // Sets the file size (after Flush), e.g. to drop what Allocate reserved but
  // was not used.
  virtual absl::Status Truncate(uint64_t size) = 0;
  // Flush, then fsync(2) / fdatasync(2). A failed sync is final: the data may
  // be gone, so the caller must not retry it and must treat the file as lost.
  virtual absl::Status Sync() = 0;
  virtual absl::Status DataSync() = 0;
  // Flushes and closes. Called by the destructor if needed (errors then only
  // logged).
  virtual absl::Status Close() = 0;
  virtual const std::string& path() const = 0;
};

class ReadableFile {
 public:
  virtual ~ReadableFile() = default;

  // Reads exactly dst.size() bytes at `offset`; reading past the end is an
  // OutOfRange error.
  virtual absl::Status Read(uint64_t offset, absl::Span<uint8_t> dst) = 0;
  using ReadCallback = std::function<void(absl::Status)>;
  // Queues a read of exactly dst.size() bytes. `done` runs on the calling
  // thread, inside this or a later ReadAsync/WaitAny/WaitReads call, when the
  // read completed or failed; `dst` must stay valid until then.
  virtual absl::Status ReadAsync(uint64_t offset, absl::Span<uint8_t> dst,
                                 ReadCallback done) = 0;
  // Waits until at least one queued read completed and ran its callback;
  // returns at once when nothing is queued.
  virtual absl::Status WaitAny() = 0;
  // Queues a read whose error, if any, WaitReads() returns.
  virtual absl::Status ReadQueued(uint64_t offset, absl::Span<uint8_t> dst) = 0;
  // Waits for every queued read and returns the first error of the ReadQueued()
  // reads.
  virtual absl::Status WaitReads() = 0;
  virtual absl::StatusOr<uint64_t> Size() = 0;
  virtual const std::string& path() const = 0;
};

// Which file a path names: its device and inode. A renamed file keeps it.
struct FileId {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const FileId& o) const {
    return device == o.device && inode == o.inode;
  }
};

// A file mapped into memory (MAP_SHARED): the staging slots that trainers fill
// and the daemon persists. Unmapped on destruction.
class MappedFile {
 public:
  virtual ~MappedFile() = default;
  virtual uint8_t* data() = 0;
  virtual size_t size() const = 0;
  virtual const std::string& path() const = 0;
  // The mapped file, whatever it is called now.
  virtual FileId id() const = 0;
  // False once the file has no name left (it was deleted while mapped: its
  // memory lives only as long as this mapping).
  virtual absl::StatusOr<bool> Linked() = 0;
  // A file created with `reserve` off: reserves the pages of bytes [offset,
  // offset + length) and maps them in, before they are written (out of
  // memory is then this error rather than a SIGBUS at the write).
  virtual absl::Status Reserve(uint64_t offset, uint64_t length) = 0;
};

struct MapOptions {
  // Create the file (failing if it exists) with this size; 0 maps an existing
  // file whole.
  uint64_t create_size = 0;
  // A read-only mapping of an existing file takes a reader's shared lock
  // (LockForReading) for as long as it lives.
  bool writable = true;
  // Mode of a created file.
  int mode = 0600;
  // A created file's pages are reserved now (posix_fallocate). Off: the file
  // is sparse, and its writer reserves each range before writing it
  // (MappedFile::Reserve), on as many threads as it writes with.
  bool reserve = true;
  // Fault the whole mapping in now (MAP_POPULATE): one pass instead of a fault
  // per page later.
  bool populate = false;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Creates `path` (truncating an existing file) for writing.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const FileOptions& options) = 0;
  virtual absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(
      const std::string& path, const FileOptions& options) = 0;

  // rename(2): atomic replacement of `to`. Durable only after SyncDir of both
  // parents.
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  // link(2): a second name for the file `existing` (same file system; `link`
  // must not exist). Durable only after SyncDir of the new name's parent.
  virtual absl::Status HardLink(const std::string& existing,
                                const std::string& link) = 0;
  // fsync of a directory, which makes creations, renames and unlinks in it
  // durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  virtual absl::Status Unlink(const std::string& path) = 0;
  // Creates the directory and its missing parents (mode 0755). Existing is not
  // an error.
  virtual absl::Status CreateDirs(const std::string& path) = 0;
  // As CreateDirs, and `path` itself is made 0700 (an existing one too): a
  // directory only this uid may enter.
  virtual absl::Status CreatePrivateDirs(const std::string& path) = 0;
  // Removes an empty directory.
  virtual absl::Status RemoveDir(const std::string& path) = 0;
  // Names of the entries of `dir`, without "." and "..", sorted.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) = 0;
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;
  // The identity of the file at `path` (a symlink there is not followed).
  virtual absl::StatusOr<FileId> GetFileId(const std::string& path) = 0;
  // Whether a reader has `path` open: readable files (and ReaderLock) hold a
  // shared flock(2) on their file, which this probes. A file that is about to
  // be written over (a recycled shard) must not be.
  virtual absl::StatusOr<bool> InUse(const std::string& path) = 0;
  virtual absl::StatusOr<bool> Exists(const std::string& path) = 0;
  // Bytes available to an unprivileged user on the file system holding `path`.
  virtual absl::StatusOr<uint64_t> FreeSpace(const std::string& path) = 0;
  // Maps `path` (creating it when options.create_size > 0; never following a
  // symlink there).
  virtual absl::StatusOr<std::unique_ptr<MappedFile>> MapFile(
      const std::string& path, const MapOptions& options) = 0;
  // Opens the existing file `path` to be written in place (never creating,
  // truncating or following a symlink there) and hands over the descriptor:
  // for a writer outside this interface, a forked child copying memory into
  // a staging slot with pwrite(2).
  virtual absl::StatusOr<UniqueFd> OpenForWritingInPlace(
      const std::string& path) = 0;
};

// Options of the real file system.
struct PosixFsOptions {
  // Use io_uring for writes and queued reads. When the kernel refuses io_uring,
  // the file system logs one warning and uses pwrite/pread instead.
  bool use_io_uring = true;
  // Requests in flight per file.
  unsigned queue_depth = 16;
  // Writes and reads are split into requests of at most this many bytes.
  size_t max_request_bytes = 1 << 20;
  // Tests only: consulted for every io_uring submission.
  UringFaultHook uring_fault_hook;
};

std::unique_ptr<FileSystem> NewPosixFileSystem(
    const PosixFsOptions& options = {});

// A process-wide posix file system with default options.
FileSystem* DefaultFileSystem();

// What a reader does right after opening `path` as `fd` (readable files do it
// themselves): takes the shared lock FileSystem::InUse probes, then checks
// that `path` still names the file opened. NotFound when it no longer does (it
// was retired, to be written over, in between).
absl::Status LockForReading(int fd, const std::string& path);

// True when io_uring can be set up in this process (kernel support and no
// seccomp filter).
bool IoUringAvailable();

// "a/b/c" -> "a/b"; "c" -> "."; "/c" -> "/".
std::string DirName(absl::string_view path);
// "a/b/c" -> "c".
std::string BaseName(absl::string_view path);
std::string JoinPath(absl::string_view dir, absl::string_view name);

// Reads a whole file through `fs` (tools and tests; not for large data).
absl::StatusOr<std::string> ReadFileToString(FileSystem* fs,
                                             const std::string& path);
// Writes `contents` to `path` with buffered I/O, without sync (tests and
// tools).
absl::Status WriteStringToFile(FileSystem* fs, const std::string& path,
                               absl::string_view contents);
// Replaces `path` with `contents` as a whole, durably: written to
// `path`.tmp, fsynced, renamed over `path`, the directory fsynced. Until it
// returns OK a reader (and a power loss) finds the old file or none, never
// part of the new one.
absl::Status ReplaceFileDurably(FileSystem* fs, const std::string& path,
                                absl::string_view contents);

}  // namespace ckpt::io

#endif  // CKPT_IO_FILE_SYSTEM_H_
