// FaultInjectionFs wraps a real FileSystem and, for tests, makes it fail the
// way disks and kernels fail: ENOSPC or EIO at the n-th write, a short write
// that persisted a prefix, EIO on the n-th fsync (after which the file's
// unsynced data is lost, as on Linux, even if a later fsync succeeds), and a
// simulated power loss that reverts every directory it touched to its durable
// state: files keep only their data as of their last successful fsync, and
// creations, renames and unlinks since the directory's last fsync are undone.
// Torn writes (a prefix of the unsynced writes reaching the disk) can be
// enabled for the power loss.
//
// The durable state is modelled with whole-file copies, so this is for small
// test files only, like rocksdb's FaultInjectionTestFS. Open files must be
// closed before SimulatePowerLoss(). A running daemon's files are modelled
// instead by an UnsyncedJournal (ModelDurabilityByJournal): no copies, and the
// power loss is cut in the process (CutPower) and carried out on its files
// once it is dead (ApplyPowerLossPlan).
//
// Thread-safety: thread-safe.
#ifndef CKPT_IO_FAULT_INJECTION_FS_H_
#define CKPT_IO_FAULT_INJECTION_FS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"
#include "io/unsynced_journal.h"

namespace ckpt::io {

class FaultInjectionFs final : public FileSystem {
 public:
  // `base` must outlive this object.
  explicit FaultInjectionFs(FileSystem* base);
  ~FaultInjectionFs() override;

  // Faults are keyed by the 1-based count of that kind of call since
  // construction or the last SimulatePowerLoss(). Each fires once.
  void FailWriteAt(int n,
                   int err);  // the n-th Write fails; nothing of it is written
  void ShortWriteAt(int n,
                    int err);  // the n-th Write persists a prefix, then fails
  void FailSyncAt(int n, int err);     // the n-th Sync/DataSync fails
  void FailSyncDirAt(int n, int err);  // the n-th SyncDir fails
  // After `n` mutating calls (create, write, allocate, truncate, sync, rename,
  // directory sync, unlink) the power is "out": every later call fails with EIO
  // until SimulatePowerLoss().
  void PowerLossAfter(int n);
  // On SimulatePowerLoss, let a random prefix of each file's unsynced writes
  // reach the disk, the last of them torn at a 512-byte boundary.
  void EnableTornWrites(uint64_t seed);

  // Until changed, every write and fallocate fails with `write_err` (e.g.
  // ENOSPC, EIO) and every fsync with `sync_err`; 0 turns that kind off. For
  // faults switched on and off while a daemon runs (ckptd --fault-injection).
  void SetPersistentFaults(int write_err, int sync_err);
  // A slow disk: every Write and WriteBorrowed first sleeps for its size at
  // this many bytes per second (0: full speed).
  void SetWriteThroughput(uint64_t bytes_per_second);
  // Keeps no copies of file contents, for files too large to copy (a running
  // daemon's shards): SimulatePowerLoss() is then refused.
  void DisableDurabilityModel();
  // Models durability with an UnsyncedJournal (no copies of file contents;
  // for a running daemon's shards): SimulatePowerLoss() is then refused, and
  // CutPower() is the power loss.
  void ModelDurabilityByJournal();
  // The power goes out: every later mutating call fails with EIO, and fsyncs
  // in flight do not count. Returns the journal's plan of what the loss takes,
  // for ApplyPowerLossPlan() once the process is dead. Needs the journal
  // model.
  absl::StatusOr<std::string> CutPower();
  // Runs `hook(from)` before every rename reaches the base file system, with
  // no lock held: another process's step (a reader locking the file) lands
  // between the caller's checks and its rename, the interleaving a race test
  // needs.
  void BeforeRename(std::function<void(const std::string& from)> hook);

  // Reverts every touched directory to its durable state and clears the fault
  // schedule.
  absl::Status SimulatePowerLoss();

  int writes() const;
  int syncs() const;
  int mutations() const;

  // FileSystem
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const FileOptions& options) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> NewReadableFile(
      const std::string& path, const FileOptions& options) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  // Passed through (counted as a mutation); the power-loss model does not
  // track the new name.
  absl::Status HardLink(const std::string& existing,
                        const std::string& link) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status Unlink(const std::string& path) override;
  absl::Status CreateDirs(const std::string& path) override;
  absl::Status CreatePrivateDirs(const std::string& path) override;
  absl::Status RemoveDir(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override;
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override;
  absl::StatusOr<bool> Exists(const std::string& path) override;
  absl::StatusOr<FileId> GetFileId(const std::string& path) override;
  absl::StatusOr<bool> InUse(const std::string& path) override;
  absl::StatusOr<uint64_t> FreeSpace(const std::string& path) override;
  // Passed through: mappings live in memory (tmpfs), outside the power-loss
  // model.
  absl::StatusOr<std::unique_ptr<MappedFile>> MapFile(
      const std::string& path, const MapOptions& options) override;
  // Refused while the power is out, else passed through: what is written
  // through the descriptor (staging slots, in tmpfs) is outside the model.
  absl::StatusOr<UniqueFd> OpenForWritingInPlace(
      const std::string& path) override;

 private:
  class File;
  friend class File;
  // Sleeps as long as a slow disk takes to write `bytes`.
  void Throttle(uint64_t bytes);

  struct Inode {
    std::string durable;  // contents as of the last successful fsync
    bool poisoned =
        false;  // an fsync failed: later fsyncs "succeed" but persist nothing
    std::vector<std::pair<uint64_t, std::string>>
        unsynced;  // writes since the last fsync
  };
  enum class Op { kCreate, kWrite, kSync, kRename, kSyncDir, kUnlink };
  struct Fault {
    int at = 0;
    int err = 0;
  };

  // Counts a mutating call; returns the error to fail it with (power out), or
  // OK.
  absl::Status BeginMutation(absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrackDir(const std::string& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PathOf(int inode) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string TornContents(const Inode& inode)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Called by File.
  absl::Status OnWrite(int inode, const std::string& path, uint64_t offset,
                       absl::Span<const uint8_t> bytes, bool* short_write,
                       int* err);
  // `injected_err`: the errno the sync fails with, 0 if it ran in the base.
  absl::Status OnSync(int inode, const std::string& path, int injected_err);
  absl::Status BeforeSync(const std::string& path, int* inject_err);
  absl::Status PersistentWriteFault(const std::string& path);
  absl::Status OnMetadata(absl::string_view what);
  void OnResize(int inode, uint64_t size, bool shrink);

  FileSystem* const base_;
  mutable absl::Mutex mu_;
  std::function<void(const std::string&)> before_rename_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> current_ ABSL_GUARDED_BY(mu_);  // path -> inode
  std::map<std::string, std::map<std::string, int>> durable_dirs_
      ABSL_GUARDED_BY(mu_);
  std::map<int, Inode> inodes_ ABSL_GUARDED_BY(mu_);
  int next_inode_ ABSL_GUARDED_BY(mu_) = 1;

  int writes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t write_bytes_per_second_ ABSL_GUARDED_BY(mu_) = 0;
  int syncs_ ABSL_GUARDED_BY(mu_) = 0;
  int dir_syncs_ ABSL_GUARDED_BY(mu_) = 0;
  int mutations_ ABSL_GUARDED_BY(mu_) = 0;
  Fault fail_write_ ABSL_GUARDED_BY(mu_);
  Fault short_write_ ABSL_GUARDED_BY(mu_);
  Fault fail_sync_ ABSL_GUARDED_BY(mu_);
  Fault fail_sync_dir_ ABSL_GUARDED_BY(mu_);
  int power_loss_after_ ABSL_GUARDED_BY(mu_) = -1;
  int persistent_write_err_ ABSL_GUARDED_BY(mu_) = 0;
  int persistent_sync_err_ ABSL_GUARDED_BY(mu_) = 0;
  bool model_durability_ ABSL_GUARDED_BY(mu_) = true;  // by copies
  bool journal_model_ ABSL_GUARDED_BY(mu_) = false;
  UnsyncedJournal journal_ ABSL_GUARDED_BY(mu_);
  uint64_t kept_links_ ABSL_GUARDED_BY(mu_) = 0;
  bool power_out_ ABSL_GUARDED_BY(mu_) = false;
  bool torn_ ABSL_GUARDED_BY(mu_) = false;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::io

#endif  // CKPT_IO_FAULT_INJECTION_FS_H_
