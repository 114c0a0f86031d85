// CopyLanding: one copy of the shared tier landing from an object store into
// a tmpfs file as its readers ask for byte ranges. A range missing is read
// from the store once, by the first reader who asks for it (ranged GETs,
// straight into the file's mapping), while the others who want it wait; a
// failed read leaves the range to the next reader who asks. Starting lands
// the footer and the manifest, so the file describes itself at once; the
// rest lands only where it is read (a resharded restore reads its boxes'
// byte ranges only), or whole when asked. The file is the self-contained
// form of the copy (snapshot/self_contained.h); every chunk is checked by
// the reader that reads it.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_PEER_COPY_LANDING_H_
#define CKPT_DAEMON_PEER_COPY_LANDING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/common/byte_ranges.h"
#include "io/file_system.h"
#include "snapshot/self_contained.h"

namespace ckpt::daemon {

class CopyLanding {
 public:
  // Opens the copy at `path` in `store` and creates `local_path` in `local`
  // (its tmpfs pages reserved, after `reserve` was told its size) with its
  // footer and manifest landed.
  static absl::StatusOr<std::unique_ptr<CopyLanding>> Start(
      io::FileSystem* store, const std::string& path, io::FileSystem* local,
      const std::string& local_path,
      const std::function<void(uint64_t size)>& reserve);

  uint64_t size() const { return size_; }
  // Returns once bytes [offset, offset + length) are in the local file: the
  // bytes this call read from the store (others may have read the rest).
  absl::StatusOr<uint64_t> Ensure(uint64_t offset, uint64_t length)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every byte is landed.
  bool whole() const ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes read from the store so far.
  uint64_t landed_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Range = ByteRanges::Range;
  CopyLanding(snapshot::SelfContained view,
              std::unique_ptr<io::MappedFile> file, std::string path);
  // The parts of [begin, end) neither landed nor being read by someone.
  std::vector<Range> Unclaimed(uint64_t begin, uint64_t end) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads `ranges` (claimed by this caller) from the store, piece by piece,
  // each landed as soon as it is read.
  absl::Status Fetch(const std::vector<Range>& ranges, uint64_t* read)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Read(const Range& range) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string path_;  // in the store, for errors
  const uint64_t size_;
  snapshot::SelfContained view_;
  // An incremental copy's view (made of several files) reads one range at a
  // time; a plain copy's reads run at once.
  absl::Mutex view_mu_;
  const std::unique_ptr<io::MappedFile> file_;
  mutable absl::Mutex mu_;
  ByteRanges landed_ ABSL_GUARDED_BY(mu_);
  ByteRanges reading_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_COPY_LANDING_H_
