// StagingArena manages the memory tier (T0): one file per staging slot in a
// tmpfs directory, created by the daemon, mapped and filled by the trainer, and
// owned by the daemon from StageComplete on. Because slots are files, a trainer
// crash or a daemon crash loses none of them; only a reboot does. The arena
// enforces a memory budget: when a new slot does not fit, it waits for space or
// refuses at once (the configured policy), naming the budget and what is in
// use, and never lets the machine run out of memory.
//
//   <dir>/<job>/<step:020>-<rank:010>.slot        (directories 0700, files
//   0600)
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_MEMORY_STAGING_ARENA_H_
#define CKPT_DAEMON_MEMORY_STAGING_ARENA_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/common/slot_id.h"
#include "io/file_system.h"
#include "io/thread_pool.h"

namespace ckpt::daemon {

enum class FullPolicy { kWait, kSkip };

struct StagingOptions {
  std::string dir;
  uint64_t budget_bytes = 1ull << 30;
  FullPolicy policy = FullPolicy::kWait;
  // kWait gives up after this long.
  absl::Duration wait_timeout = absl::Seconds(60);
};

struct SlotInfo {
  SlotId id;
  std::string path;
  uint64_t bytes = 0;
  // Allocate: how long it waited for the budget, and how long making a fresh
  // slot took (zero when a free one was reused).
  absl::Duration waited;
  absl::Duration made;
};

class StagingArena {
 public:
  static absl::StatusOr<std::unique_ptr<StagingArena>> Open(
      io::FileSystem* fs, const StagingOptions& options);

  // Reserves `bytes` and creates the slot file. A slot that already exists is
  // an error (AlreadyExists). A request larger than the whole budget fails at
  // once.
  // With the wait policy, waits for space until `wait_timeout` passed or
  // `deadline` (the caller's own, e.g. its RPC's) came, whichever is first.
  absl::StatusOr<SlotInfo> Allocate(
      const SlotId& id, uint64_t bytes,
      absl::Time deadline = absl::InfiniteFuture());
  // Makes a free slot of `bytes` ready in the background (created, its pages
  // allocated, mapped) when none of that size is free or being made, and it
  // and one more fit the budget beside the slots in use and kept: the next
  // Allocate of that size then takes it instead of allocating pages while a
  // trainer waits. A slot being made counts against the budget. Free slots of
  // other sizes are dropped when that makes the room. The slot's pages are
  // faulted in by the daemon's own mapping, so they are cleared before a
  // trainer copies into them.
  void PrepareAhead(uint64_t bytes);
  // Free slots made by PrepareAhead so far (for tests and benchmarks).
  uint64_t prepared() const;
  // Whether `bytes` more fit in the budget now.
  bool Fits(uint64_t bytes) const;
  // Deletes the slot file and returns its bytes to the budget. Unknown slots
  // are NotFound. A slot a reader still holds (a restore's shared lock, see
  // io::LockForReading) is deleted, never kept for reuse: the reader's bytes
  // are not written over.
  absl::Status Release(const SlotId& id);
  absl::StatusOr<SlotInfo> Find(const SlotId& id) const;
  // The daemon's mapping of a live slot, made on first use and kept with the
  // slot file, also while it waits in the free list for reuse: a reused slot
  // is persisted without mapping and faulting in its pages again.
  absl::StatusOr<std::shared_ptr<io::MappedFile>> Map(const SlotId& id);
  // The daemon's mapping of slot `id` while it is live, or after its release
  // while it waits in the free list, not yet reused (its bytes as they were):
  // what an XOR delta may be made against. Once released the bytes may be
  // written over at any moment by a reuse, so a reader copies them out and
  // checks them. NotFound when there is none.
  absl::StatusOr<std::shared_ptr<io::MappedFile>> MapLiveOrReleased(
      const SlotId& id);

  // After a restart: every slot file found is adopted when `keep` says so (its
  // bytes count against the budget) and deleted otherwise. Returns the adopted
  // slots.
  absl::StatusOr<std::vector<SlotInfo>> Recover(
      const std::function<bool(const SlotInfo&)>& keep);

  // A save waiting for the budget (Allocate with the wait policy): the slot
  // and how many bytes more than the budget has it needs now. The first
  // waiter, if any.
  struct Shortage {
    SlotId id;
    uint64_t bytes = 0;
  };
  std::optional<Shortage> Waiting() const;
  // How many bytes a new slot of `bytes` needs beyond what the budget has
  // room for now (0: it fits).
  uint64_t ShortfallFor(uint64_t bytes) const;
  // Live slots (job, step, rank and bytes), for saying what holds the budget.
  std::vector<SlotInfo> Slots() const;

  // Bytes of live slots (kept free slots not included).
  uint64_t used_bytes() const;
  uint64_t free_bytes() const;
  uint64_t budget_bytes() const { return options_.budget_bytes; }
  std::string SlotPath(const SlotId& id) const;

 private:
  StagingArena(io::FileSystem* fs, StagingOptions options)
      : fs_(fs), options_(std::move(options)) {}

  io::FileSystem* const fs_;
  const StagingOptions options_;
  mutable absl::Mutex mu_;
  std::string FreeDir() const;

  struct Slot {
    SlotInfo info;
    std::shared_ptr<io::MappedFile> map;  // null until first mapped
  };
  struct FreeSlot {
    std::string path;
    std::shared_ptr<io::MappedFile> map;
    SlotId former;  // the slot it was until released
  };
  // Allocate's steps: the slot's bytes reserved within the budget (waiting
  // per the policy; returns how long), a kept free slot of its size taken
  // for reuse, and the free slots the budget needs back named in `evict`;
  // then its file made (or the free one renamed), outside the lock.
  absl::StatusOr<absl::Duration> Reserve(const SlotId& id, uint64_t bytes,
                                         absl::Time deadline, FreeSlot* reuse,
                                         std::vector<std::string>* evict);
  absl::StatusOr<std::shared_ptr<io::MappedFile>> MakeSlotFile(
      const SlotId& id, uint64_t bytes, FreeSlot reuse, absl::Duration* made);

  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<SlotId, Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::multimap<uint64_t, FreeSlot> free_ ABSL_GUARDED_BY(mu_);  // by size
  uint64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Allocates waiting for the budget, and the bytes each needs.
  std::map<SlotId, uint64_t> waiting_ ABSL_GUARDED_BY(mu_);
  uint64_t next_free_id_ ABSL_GUARDED_BY(mu_) = 0;
  // PrepareAhead: the bytes of the slot being made (0: none), and the count
  // made.
  uint64_t preparing_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t prepared_ ABSL_GUARDED_BY(mu_) = 0;
  // Makes PrepareAhead's slots; declared last, so destroyed (drained) first.
  std::unique_ptr<io::ThreadPool> preparer_ =
      std::make_unique<io::ThreadPool>(1);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_MEMORY_STAGING_ARENA_H_
