// VersionStore: the published versions this node holds (issue #37), in a
// tmpfs directory, and the memory they may take.
//
// Layout: `<dir>/<topic>/<version, 20 digits>/` holds a version's files, one
// per rank (`rank-<r>.shard`), and its record (`version.pb`), so that opening
// one asks nobody. A version being made or arriving lies in a directory of
// its own beside them (a name starting with '.') until Place renames it into
// place whole: a reader never finds a version whose files are not all there.
// What such a directory a crash left behind goes at Open.
//
// Memory. Every version held, and every one being made or arriving (a Room
// reserved for it), counts against `budget_bytes`. A version a reader still
// holds open (readers keep a shared flock(2) on the files they read: see
// io::FileSystem::InUse) is never removed: removing it would free nothing,
// since the kernel keeps an open file. So a topic keeps its newest
// `keep_versions` versions and every older one a reader holds; when a new
// version needs room, the oldest versions no reader holds go first, down to
// each topic's newest, and what still does not fit is refused with
// ResourceExhausted naming what holds the memory.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_PUBLISH_VERSION_STORE_H_
#define CKPT_DAEMON_PUBLISH_VERSION_STORE_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"
#include "proto/publish.pb.h"

namespace ckpt::daemon {

struct VersionStoreOptions {
  std::string dir;                     // tmpfs
  int keep_versions = 2;               // per topic, at least 1
  uint64_t budget_bytes = 4ull << 30;  // every topic's versions together
};

class VersionStore {
 public:
  // Bytes reserved for a version being made or arriving, given back when
  // the Room goes (once the version is placed, its files count instead).
  class Room {
   public:
    ~Room();
    Room(const Room&) = delete;
    Room& operator=(const Room&) = delete;
    uint64_t bytes() const { return bytes_; }
    // The version turned out to need `bytes` in all: more room, made as
    // MakeRoom makes it.
    absl::Status GrowTo(uint64_t bytes);

   private:
    friend class VersionStore;
    Room(VersionStore* store, uint64_t bytes, std::string what)
        : store_(store), bytes_(bytes), what_(std::move(what)) {}
    VersionStore* const store_;
    uint64_t bytes_;
    const std::string what_;
  };

  // Removes the directories of versions cut short (being made or arriving)
  // that a crash left in `options.dir`. The directory itself is made (mode
  // 0700) by the first NewDir.
  static absl::StatusOr<std::unique_ptr<VersionStore>> Open(
      io::FileSystem* fs, VersionStoreOptions options);

  const VersionStoreOptions& options() const { return options_; }
  static std::string RankFileName(uint32_t rank);
  std::string VersionDir(const std::string& topic, uint64_t version) const;

  // The versions of `topic` placed here.
  std::set<uint64_t> Held(const std::string& topic) const;
  // The record kept beside a placed version's files; NotFound when it is
  // not here, DataLoss when the record is not that version's.
  absl::StatusOr<proto::VersionRecord> Record(const std::string& topic,
                                              uint64_t version) const;

  // `bytes` more for `what` (a version being made or arriving): versions no
  // reader holds are removed, oldest first, to make room. ResourceExhausted
  // when it cannot be made, naming the budget and what holds it.
  absl::StatusOr<std::unique_ptr<Room>> MakeRoom(uint64_t bytes,
                                                 const std::string& what);
  // A directory for a version of `topic` being made or arriving, named
  // `name` (starting with '.'), made empty.
  absl::StatusOr<std::string> NewDir(const std::string& topic,
                                     const std::string& name);
  // Writes `record` beside the files in `dir` and renames `dir` into place
  // as the version (replacing a directory of the same version left by an
  // earlier life of this node), then drops the versions of its topic the
  // store no longer keeps.
  absl::Status Place(const std::string& dir,
                     const proto::VersionRecord& record);
  // Removes a directory of files (a version's, or one cut short).
  void RemoveDir(const std::string& dir);
  // Removes the versions of `topic` beyond its newest keep_versions that no
  // reader holds.
  void CollectGarbage(const std::string& topic);

  // The bytes of every placed version's files, and of the rooms reserved.
  uint64_t UsedBytes() const;

 private:
  struct Placed {
    std::string topic;
    uint64_t version = 0;
    uint64_t bytes = 0;
    int64_t created_unix_micros = 0;
    bool newest = false;  // of its topic
    bool in_use = false;  // a reader holds it open
  };
  VersionStore(io::FileSystem* fs, VersionStoreOptions options)
      : fs_(fs), options_(std::move(options)) {}
  std::string TopicDir(const std::string& topic) const;
  // Every placed version, with what MakeRoom weighs.
  std::vector<Placed> Versions() const;
  uint64_t BytesIn(const std::string& dir) const;
  bool InUse(const std::string& topic, uint64_t version) const;
  // MakeRoom's and GrowTo's work: `more` bytes reserved once they fit.
  absl::Status Reserve(uint64_t more, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(room_mu_);
  void GiveBack(uint64_t bytes);

  io::FileSystem* const fs_;
  const VersionStoreOptions options_;
  absl::Mutex room_mu_;  // one room made at a time
  mutable absl::Mutex mu_;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PUBLISH_VERSION_STORE_H_
