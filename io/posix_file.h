// The open files of the POSIX file system (posix_fs.cc): writable files
// (io_uring, or pwrite when the kernel refuses it; O_DIRECT when asked),
// readable files and read-only mappings, and the helpers both files and the
// file system use. Internal to io/; everything else goes through FileSystem.
//
// Thread-safety: a file is used by one thread at a time; the helpers are
// thread-safe.
#ifndef CKPT_IO_POSIX_FILE_H_
#define CKPT_IO_POSIX_FILE_H_

#include <sys/mman.h>
#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "io/file_system.h"

namespace ckpt::io::internal {

#ifdef MADV_POPULATE_WRITE
inline constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
inline constexpr int kMadvPopulateWrite = 23;  // Linux 5.14, older libc headers
#endif

// errno as a Status naming the operation and the path.
absl::Status PosixError(absl::string_view op, absl::string_view path);
// Opens with O_DIRECT when asked, falling back to buffered I/O where the file
// system refuses it; `is_direct` says which.
int OpenMaybeDirect(const std::string& path, int flags, bool direct,
                    bool* is_direct);
FileId IdOf(const struct stat& st);

// The files take `fd` over.
std::unique_ptr<WritableFile> NewPosixWritableFile(
    std::string path, int fd, bool direct, const PosixFsOptions& options);
std::unique_ptr<ReadableFile> NewPosixReadableFile(
    std::string path, int fd, bool direct, const PosixFsOptions& options);
std::unique_ptr<MappedFile> NewPosixMappedFile(std::string path, int fd,
                                               FileId id, uint8_t* data,
                                               size_t size);

}  // namespace ckpt::io::internal

#endif  // CKPT_IO_POSIX_FILE_H_
