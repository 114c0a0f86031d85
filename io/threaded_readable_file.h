// ThreadedReadableFile: a ReadableFile whose reads are blocking calls safe to
// make from several threads at once (ranged GETs to an object store, reads
// that first ask ckptd to land their bytes): subclasses give Read, Size and
// path; queued and asynchronous reads run Read on threads of the file's own,
// `concurrency` at a time, their callbacks on the caller's thread.
// A subclass's destructor calls StopReads() first, so that no read runs
// into a half-destroyed object.
//
// Thread-safety: Read from any thread; the rest as ReadableFile's, one thread
// at a time.
#ifndef CKPT_IO_THREADED_READABLE_FILE_H_
#define CKPT_IO_THREADED_READABLE_FILE_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"
#include "io/thread_pool.h"

namespace ckpt::io {

class ThreadedReadableFile : public ReadableFile {
 public:
  explicit ThreadedReadableFile(int concurrency);
  ~ThreadedReadableFile() override;

  absl::Status ReadAsync(uint64_t offset, absl::Span<uint8_t> dst,
                         ReadCallback done) override;
  absl::Status WaitAny() override;
  absl::Status ReadQueued(uint64_t offset, absl::Span<uint8_t> dst) override;
  absl::Status WaitReads() override;

 protected:
  // Waits for the reads in flight; the callbacks of those not yet run are
  // dropped.
  void StopReads() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Runs the callbacks of the reads completed (with `wait`, at least one).
  void RunCompleted(bool wait) ABSL_LOCKS_EXCLUDED(mu_);

  const int concurrency_;
  size_t pending_ = 0;   // reads issued whose callbacks did not run
  absl::Status queued_;  // the first error of the queued reads
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<ReadCallback, absl::Status>> completed_
      ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ThreadPool> pool_;  // last: joined first
};

}  // namespace ckpt::io

#endif  // CKPT_IO_THREADED_READABLE_FILE_H_
