// Arrival: one version of a topic arriving at this node, a subscriber's copy
// being fetched from its peers, and read by the peers downstream while it
// arrives (the pipelined fan-out, issue #37).
//
// Each rank's file is created at its full size in the version's receiving
// directory and mapped; the fetch writes the bytes in order and reports how
// far they reached (Arrived). A reader (ReaderFrom: what the peer service
// sends downstream) waits for each piece it reads to have arrived, so a
// version travels down a chain of subscribers piece by piece, not file by
// file. Bytes found bad once a file is whole are fetched again from the
// start (Restart): a reader that already read past them fails, and its
// subscriber fetches again too. Nothing arriving is ever readable by local
// readers: the files are placed, verified, by the Subscriptions.
//
// Thread-safety: thread-safe; readers on any threads, one fetch per rank.
#ifndef CKPT_DAEMON_PUBLISH_ARRIVAL_H_
#define CKPT_DAEMON_PUBLISH_ARRIVAL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "io/file_system.h"
#include "proto/publish.pb.h"

namespace ckpt::daemon {

class Arrival : public std::enable_shared_from_this<Arrival> {
 public:
  // Creates the files of `record` (one per rank, of the sizes it lists) in
  // `dir`, made first (mode 0700).
  static absl::StatusOr<std::shared_ptr<Arrival>> Create(
      io::FileSystem* fs, proto::VersionRecord record, std::string dir);

  const proto::VersionRecord& record() const { return record_; }
  const std::string& dir() const { return dir_; }
  std::string PathOf(uint32_t rank) const;
  uint64_t SizeOf(uint32_t rank) const;

  // The fetch's side. The bytes of `rank`'s file from `from` on, to fill.
  absl::Span<uint8_t> Space(uint32_t rank, uint64_t from);
  // Bytes [0, end) of `rank`'s file are in place.
  void Arrived(uint32_t rank, uint64_t end);
  uint64_t ArrivedOf(uint32_t rank) const;
  // `rank`'s file as mapped (what arrived, and zeros after it): verified
  // from here once whole.
  absl::Span<const uint8_t> Bytes(uint32_t rank) const;
  // `rank`'s bytes are fetched again from the start: readers that read any
  // of them fail.
  void Restart(uint32_t rank);
  // The version is whole and placed (readers read on), or given up (readers
  // waiting fail with `why`).
  void Finish(absl::Status why);

  // A reader of `rank`'s file from `offset` on, `stall`: how long a read
  // waits for a piece that does not arrive. Its Size() is the bytes from
  // `offset` to the end.
  absl::StatusOr<std::unique_ptr<io::ReadableFile>> ReaderFrom(
      uint32_t rank, uint64_t offset, absl::Duration stall);
  // For a sender that reads `rank`'s file itself (sendfile): waits until its
  // bytes before `end` arrived, failing as a reader's read would. Keeps the
  // arrival alive.
  std::function<absl::Status(uint64_t end)> Waiter(uint32_t rank,
                                                   absl::Duration stall);

 private:
  class Reader;
  Arrival(proto::VersionRecord record, std::string dir)
      : record_(std::move(record)), dir_(std::move(dir)) {}
  // Waits until bytes [0, end) of `rank` arrived; fails if the rank was
  // restarted since `generation`, the arrival was given up, or nothing
  // arrived for `stall`.
  absl::Status WaitFor(uint32_t rank, uint64_t end, uint64_t generation,
                       absl::Duration stall);
  uint64_t GenerationOf(uint32_t rank) const;

  const proto::VersionRecord record_;
  const std::string dir_;
  std::vector<std::unique_ptr<io::MappedFile>> files_;  // by rank
  mutable absl::Mutex mu_;
  std::vector<uint64_t> arrived_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> generation_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PUBLISH_ARRIVAL_H_
