// UnsyncedJournal records, without copying any file contents, what a power
// loss would take from a running process's files: creations and renames not
// yet made durable by an fsync of their directory, and each file's byte
// ranges written since its last successful fsync (or lost to a failed one).
// Its Plan() is the list of operations that turn the files into one state a
// power loss could leave; ApplyPowerLossPlan() carries it out once the process
// is dead (ckptd --fault-injection, `ckpt-chaos`'s power_loss fault).
//
// The state it leaves is the harshest of the possible ones, never a kinder
// one:
//   - a file is truncated to its size at its last fsync (an open with O_TRUNC
//     counts as size 0), and its unsynced ranges below that size are
//     overwritten with garbage (neither the old nor the new bytes);
//   - creations and renames since the last fsync of the new name's directory
//     are undone, newest first; a name a rename replaced comes back (the
//     caller keeps it under a hard link, KeptLinkName());
//   - unlinks are taken as durable at once (the file stays gone).
// Directories themselves are taken as durable once created.
//
// Thread-safety: not thread-safe; FaultInjectionFs calls it under its lock.
#ifndef CKPT_IO_UNSYNCED_JOURNAL_H_
#define CKPT_IO_UNSYNCED_JOURNAL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "io/file_system.h"

namespace ckpt::io {

class UnsyncedJournal {
 public:
  // A file opened for writing at `path`: `existing_size` is its size if it
  // existed (nullopt-like -1 if it did not), `truncate` whether the open
  // truncates it. Returns the id the other calls take.
  int Opened(const std::string& path, int64_t existing_size, bool truncate);
  void Wrote(int id, uint64_t offset, uint64_t length);
  void Resized(int id, uint64_t size, bool shrink);  // fallocate, ftruncate
  void Synced(int id);
  void SyncFailed(int id);  // the unsynced ranges are lost for good
  // A rename; `kept` is the hard link under which the name it replaced is
  // kept (empty: `to` did not exist).
  void Renamed(const std::string& from, const std::string& to,
               const std::string& kept);
  void Unlinked(const std::string& path);
  // A hard link made: undone like a creation (the file's data stays tracked
  // under its first name).
  void Linked(const std::string& link);
  // Makes the creations and renames into `dir` durable; returns the kept
  // links that may now be deleted.
  std::vector<std::string> DirSynced(const std::string& dir);

  // The operations a power loss amounts to, one per line.
  std::string Plan() const;

  // The name under which a rename's replaced file is kept until its directory
  // is synced. ListDir hides such names.
  static std::string KeptLinkName(const std::string& path, uint64_t n);
  static bool IsKeptLink(absl::string_view name);

 private:
  struct FileState {
    uint64_t size = 0;         // as written
    uint64_t synced_size = 0;  // at the last successful fsync
    // Ranges written since the last fsync, and ranges a failed fsync lost:
    // begin -> end, merged.
    std::map<uint64_t, uint64_t> dirty;
    std::map<uint64_t, uint64_t> lost;
  };
  struct NameOp {
    bool create = false;
    std::string from, to, kept;  // a creation: `to` only
  };

  int IdAt(const std::string& path);

  std::map<std::string, int> paths_;  // current name -> id
  std::map<int, FileState> files_;
  std::vector<NameOp> pending_;  // not yet durable, oldest first
  int next_id_ = 1;
};

// Carries out a Plan() on `fs` (the real file system, the writer dead).
absl::Status ApplyPowerLossPlan(FileSystem* fs, absl::string_view plan);

}  // namespace ckpt::io

#endif  // CKPT_IO_UNSYNCED_JOURNAL_H_
