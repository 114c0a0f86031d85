// SyncReadableFile: a ReadableFile that is not a file on disk (a view made of
// other files, bytes in memory, bytes still arriving). Subclasses give Read,
// Size and path; the queued and asynchronous reads run synchronously.
//
// Thread-safety: as ReadableFile's, one thread at a time.
#ifndef CKPT_IO_SYNC_READABLE_FILE_H_
#define CKPT_IO_SYNC_READABLE_FILE_H_

#include <utility>

#include "io/file_system.h"

namespace ckpt::io {

class SyncReadableFile : public ReadableFile {
 public:
  absl::Status ReadAsync(uint64_t offset, absl::Span<uint8_t> dst,
                         ReadCallback done) override {
    done(Read(offset, dst));
    return absl::OkStatus();
  }
  absl::Status WaitAny() override { return absl::OkStatus(); }
  absl::Status ReadQueued(uint64_t offset, absl::Span<uint8_t> dst) override {
    absl::Status s = Read(offset, dst);
    if (!s.ok() && queued_.ok()) queued_ = s;
    return absl::OkStatus();
  }
  absl::Status WaitReads() override { return std::exchange(queued_, {}); }

 private:
  absl::Status queued_;  // the first error of the queued reads
};

}  // namespace ckpt::io

#endif  // CKPT_IO_SYNC_READABLE_FILE_H_
