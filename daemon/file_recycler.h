// FileRecycler keeps a few retired shard files, so that the next persists
// write over their blocks (ShardWriterOptions::recycle_from) instead of the
// file system freeing them here and allocating others there. Retiring a file
// moves it into the recycler's directory; a file taken is renamed away by the
// shard writer. What is kept beyond `max_files` is deleted.
//
// The files hold stale shard bytes under names that are not shards
// (<dir>/<run>-<n>.recycled); nothing reads them. A crash may leave a retired
// file under its old name, where recovery deletes it like any unreferenced
// shard file.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_FILE_RECYCLER_H_
#define CKPT_DAEMON_FILE_RECYCLER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "io/file_system.h"

namespace ckpt::daemon {

class FileRecycler {
 public:
  // Creates `dir` when needed; of the files a previous run left there, at
  // most `max_files` are kept (0 turns recycling off: every file is deleted).
  static absl::StatusOr<std::unique_ptr<FileRecycler>> Open(io::FileSystem* fs,
                                                            std::string dir,
                                                            size_t max_files);

  // Keeps `path` (a file nothing references any more) for reuse, or deletes
  // it when `max_files` are kept already or it cannot be moved.
  void Retire(const std::string& path);
  // A kept file for a shard of about `bytes` (the smallest at least that
  // large, else the largest), or empty when none is kept. It is no longer the
  // recycler's: the caller renames it away or deletes it.
  std::string Take(uint64_t bytes);
  // Deletes every kept file (when the disk is short of space).
  void Clear();
  // Files and bytes kept.
  size_t files() const;
  uint64_t bytes() const;

 private:
  FileRecycler(io::FileSystem* fs, std::string dir, size_t max_files)
      : fs_(fs),
        dir_(std::move(dir)),
        max_files_(max_files),
        run_(absl::ToUnixMicros(absl::Now())) {}
  std::string NextName() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  io::FileSystem* const fs_;
  const std::string dir_;
  const size_t max_files_;
  const int64_t run_;  // names this run's files
  mutable absl::Mutex mu_;
  std::multimap<uint64_t, std::string> kept_ ABSL_GUARDED_BY(mu_);  // by size
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_FILE_RECYCLER_H_
