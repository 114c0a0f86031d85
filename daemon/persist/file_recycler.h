// FileRecycler keeps a few retired shard files, so that the next persists
// write over their blocks (ShardWriterOptions::recycle_from) instead of the
// file system freeing them here and allocating others there. Retiring a file
// moves it into the recycler's directory; a file taken is renamed away by the
// shard writer. What is kept beyond `max_files` is deleted in the background,
// a step at a time, and each step waits (up to a second) while `busy` says a
// persist is writing: on ext4 mounted with `discard`, freeing a large file
// discards its blocks inside a journal commit, which stalls every write
// waiting for the journal (a 4 GiB shard deleted beside a persist made it 3x
// slower on the development VM).
//
// The files hold stale shard bytes under names that are not shards
// (<dir>/<run>-<n>.recycled); nothing reads them. A crash may leave a retired
// file under its old name, where recovery deletes it like any unreferenced
// shard file.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_PERSIST_FILE_RECYCLER_H_
#define CKPT_DAEMON_PERSIST_FILE_RECYCLER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "io/file_system.h"
#include "io/thread_pool.h"

namespace ckpt::daemon {

class FileRecycler {
 public:
  // Creates `dir` when needed; of the files a previous run left there, at
  // most `max_files` are kept (0 turns recycling off: every file is deleted).
  // `busy` (may be empty) says whether a deletion's next step should wait.
  static absl::StatusOr<std::unique_ptr<FileRecycler>> Open(
      io::FileSystem* fs, std::string dir, size_t max_files,
      std::function<bool()> busy = nullptr);
  // Finishes the pending deletions without waiting for `busy`.
  ~FileRecycler();
  FileRecycler(const FileRecycler&) = delete;
  FileRecycler& operator=(const FileRecycler&) = delete;

  // Keeps `path` (a file nothing references any more) for reuse. When
  // `max_files` are kept already, the kept file whose size is least like its
  // size is deleted instead, in the background.
  void Retire(const std::string& path);
  // A kept file for a shard of about `bytes` (the closest size, and at most
  // about twice that) that no reader holds open (FileSystem::InUse), or empty
  // when none fits. It is no longer the
  // recycler's: the caller renames it away or deletes it.
  std::string Take(uint64_t bytes);
  // Deletes every kept file, and the pending deletions, now (when the disk
  // is short of space); returns when they are gone.
  void Clear();
  // Returns once the deletions queued so far are done (they go on waiting
  // for `busy`).
  void WaitDeleted();
  // Files and bytes kept.
  size_t files() const;
  uint64_t bytes() const;

 private:
  FileRecycler(io::FileSystem* fs, std::string dir, size_t max_files,
               std::function<bool()> busy)
      : fs_(fs),
        dir_(std::move(dir)),
        max_files_(max_files),
        busy_(std::move(busy)),
        run_(absl::ToUnixMicros(absl::Now())) {}
  std::string NextName() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `path` for deletion on the deleter thread.
  void Delete(const std::string& path);
  // Truncates `path` by kStep at a time (each step after waiting for `busy_`
  // unless hurried), then unlinks it.
  void DeleteNow(const std::string& path);

  static constexpr uint64_t kStep = 256ull << 20;

  io::FileSystem* const fs_;
  const std::string dir_;
  const size_t max_files_;
  const std::function<bool()> busy_;
  const int64_t run_;  // names this run's files
  mutable absl::Mutex mu_;
  std::multimap<uint64_t, std::string> kept_ ABSL_GUARDED_BY(mu_);  // by size
  uint64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // deletions queued or running
  bool hurry_ ABSL_GUARDED_BY(mu_) = false;  // delete without waiting
  // Runs the deletions; declared last, so destroyed (drained) first.
  std::unique_ptr<io::ThreadPool> deleter_ =
      std::make_unique<io::ThreadPool>(1);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PERSIST_FILE_RECYCLER_H_
