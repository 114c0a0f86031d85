#include "daemon/memory/staging_arena.h"

#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/common/describe.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {
namespace {

constexpr char kSlotSuffix[] = ".slot";

std::string SlotName(uint64_t step, uint32_t rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%020" PRIu64 "-%010u%s", step, rank,
                kSlotSuffix);
  return buf;
}

// "<step:020>-<rank:010>.slot" -> (step, rank).
bool ParseSlotName(absl::string_view name, uint64_t* step, uint32_t* rank) {
  if (!absl::ConsumeSuffix(&name, kSlotSuffix)) return false;
  std::vector<absl::string_view> parts = absl::StrSplit(name, '-');
  return parts.size() == 2 && parts[0].size() == 20 && parts[1].size() == 10 &&
         absl::SimpleAtoi(parts[0], step) && absl::SimpleAtoi(parts[1], rank);
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagingArena>> StagingArena::Open(
    io::FileSystem* fs, const StagingOptions& options) {
  if (options.dir.empty())
    return absl::InvalidArgumentError("staging directory is empty");
  if (options.budget_bytes == 0)
    return absl::InvalidArgumentError("staging budget is zero");
  RETURN_IF_ERROR(fs->CreatePrivateDirs(options.dir));
  std::unique_ptr<StagingArena> arena(new StagingArena(fs, options));
  // Kept free slots of a previous run are not worth their memory now.
  const std::string free_dir = arena->FreeDir();
  if (auto names = fs->ListDir(free_dir); names.ok()) {
    for (const std::string& name : *names)
      (void)fs->Unlink(io::JoinPath(free_dir, name));
  }
  RETURN_IF_ERROR(fs->CreatePrivateDirs(free_dir));
  return arena;
}

// '+' cannot occur in a job id, so this never collides with a job's directory.
std::string StagingArena::FreeDir() const {
  return io::JoinPath(options_.dir, "+free");
}

uint64_t StagingArena::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return free_bytes_;
}

std::string StagingArena::SlotPath(const SlotId& id) const {
  return io::JoinPath(io::JoinPath(options_.dir, id.job),
                      SlotName(id.step, id.rank));
}

bool StagingArena::Fits(uint64_t bytes) const {
  absl::MutexLock lock(&mu_);
  return used_ + preparing_ + bytes <= options_.budget_bytes;
}

uint64_t StagingArena::prepared() const {
  absl::MutexLock lock(&mu_);
  return prepared_;
}

void StagingArena::PrepareAhead(uint64_t bytes) {
  constexpr size_t kMaxFreeSlots = 4;
  std::string path;
  std::vector<std::string> evict;
  {
    absl::MutexLock lock(&mu_);
    if (bytes == 0 || preparing_ != 0 || free_.count(bytes) != 0 ||
        free_.size() >= kMaxFreeSlots) {
      return;
    }
    // Room for the slot made and one more: an Allocate of that size while
    // it is being made does not have to wait for it. Free slots of other
    // sizes (a job whose state changed size) give way: the size saved now is
    // the one the next save needs.
    if (used_ + 2 * bytes > options_.budget_bytes) return;
    while (used_ + free_bytes_ + 2 * bytes > options_.budget_bytes &&
           !free_.empty()) {
      auto victim = std::prev(free_.end());
      free_bytes_ -= victim->first;
      evict.push_back(victim->second.path);
      free_.erase(victim);  // drops the daemon's mapping with it
    }
    preparing_ = bytes;
    path = io::JoinPath(FreeDir(), absl::StrCat(next_free_id_++, kSlotSuffix));
  }
  preparer_->Schedule([this, bytes, path, evict = std::move(evict)] {
    for (const std::string& old : evict) (void)fs_->Unlink(old);
    // The daemon's mapping is populated (tmpfs pages reserved by fallocate
    // are cleared on their first fault): neither the trainer's first copy
    // into the slot nor the persist that reads it then waits for that.
    absl::StatusOr<std::unique_ptr<io::MappedFile>> mapped = fs_->MapFile(
        path, io::MapOptions{.create_size = bytes, .populate = true});
    bool keep = false;
    {
      absl::MutexLock lock(&mu_);
      preparing_ = 0;
      // Slots allocated meanwhile may leave no room for it.
      keep = mapped.ok() &&
             used_ + free_bytes_ + bytes <= options_.budget_bytes &&
             free_.size() < kMaxFreeSlots;
      if (keep) {
        free_.emplace(bytes, FreeSlot{path, std::move(*mapped)});
        free_bytes_ += bytes;
        ++prepared_;
      }
    }
    if (!keep) {
      if (!mapped.ok()) {
        CKPT_LOG_WARN("preparing a staging slot of {} bytes: {}", bytes,
                      mapped.status().ToString());
      }
      (void)fs_->Unlink(path);
    }
  });
}

absl::StatusOr<SlotInfo> StagingArena::Allocate(const SlotId& id,
                                                uint64_t bytes,
                                                absl::Time deadline) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(id.job));
  // An empty state still gets a slot: the manifest says it is empty.
  if (bytes == 0) bytes = 1;
  if (bytes > options_.budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("staging slot for ", Describe(id), " needs ", bytes,
                     " bytes, more than the whole ", "memory budget of ",
                     options_.budget_bytes, " bytes (ckptd --memory_budget)"));
  }
  FreeSlot reuse;
  std::vector<std::string> evict;
  ASSIGN_OR_RETURN(const absl::Duration waited,
                   Reserve(id, bytes, deadline, &reuse, &evict));
  for (const std::string& path : evict) (void)fs_->Unlink(path);
  // Files are made outside the lock; the reservation holds the bytes
  // meanwhile.
  absl::Duration made;
  absl::StatusOr<std::shared_ptr<io::MappedFile>> map =
      MakeSlotFile(id, bytes, std::move(reuse), &made);
  absl::MutexLock lock(&mu_);
  if (!map.ok()) {
    used_ -= bytes;
    slots_.erase(id);
    return absl::Status(map.status().code(),
                        absl::StrCat("staging slot for ", Describe(id), ": ",
                                     map.status().message()));
  }
  auto it = slots_.find(id);
  if (it != slots_.end()) it->second.map = *std::move(map);
  return SlotInfo{id, SlotPath(id), bytes, waited, made};
}

absl::StatusOr<absl::Duration> StagingArena::Reserve(
    const SlotId& id, uint64_t bytes, absl::Time deadline, FreeSlot* reuse,
    std::vector<std::string>* evict) {
  const absl::Time start = absl::Now();
  absl::Duration waited;
  absl::MutexLock lock(&mu_);
  if (slots_.count(id) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("staging slot for ", Describe(id), " already exists"));
  }
  // A slot PrepareAhead is making holds its bytes until it is done.
  auto fits = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return used_ + preparing_ + bytes <= options_.budget_bytes;
  };
  if (!fits()) {
    const absl::Time until =
        std::min(absl::Now() + options_.wait_timeout, deadline);
    bool ok = false;
    if (options_.policy == FullPolicy::kWait) {
      waiting_[id] = bytes;
      ok = mu_.AwaitWithDeadline(absl::Condition(&fits), until);
      waiting_.erase(id);
    }
    waited = absl::Now() - start;
    if (!ok) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "memory budget exhausted: staging slot for ", Describe(id), " needs ",
          bytes, " bytes, ", used_, " of ", options_.budget_bytes,
          " bytes are in use by ", slots_.size(), " slots",
          options_.policy == FullPolicy::kWait
              ? absl::StrCat(" after waiting up to ",
                             absl::FormatDuration(options_.wait_timeout))
              : " (policy: skip)"));
    }
  }
  used_ += bytes;
  slots_[id] = Slot{SlotInfo{id, SlotPath(id), bytes}, nullptr};
  auto same = free_.find(bytes);
  if (same != free_.end()) {
    *reuse = std::move(same->second);
    free_bytes_ -= bytes;
    free_.erase(same);
  }
  // Kept free slots give their memory back when the budget needs it.
  while (used_ + free_bytes_ > options_.budget_bytes && !free_.empty()) {
    auto victim = std::prev(free_.end());
    free_bytes_ -= victim->first;
    evict->push_back(victim->second.path);
    free_.erase(victim);  // drops the daemon's mapping with it
  }
  return waited;
}

absl::StatusOr<std::shared_ptr<io::MappedFile>> StagingArena::MakeSlotFile(
    const SlotId& id, uint64_t bytes, FreeSlot reuse, absl::Duration* made) {
  RETURN_IF_ERROR(fs_->CreatePrivateDirs(io::JoinPath(options_.dir, id.job)));
  if (!reuse.path.empty()) {
    // Null for a reused slot the daemon has not mapped yet.
    if (fs_->Rename(reuse.path, SlotPath(id)).ok()) return std::move(reuse.map);
    (void)fs_->Unlink(reuse.path);  // fall back to a fresh slot
  }
  const absl::Time making = absl::Now();
  ASSIGN_OR_RETURN(
      std::unique_ptr<io::MappedFile> mapped,
      fs_->MapFile(SlotPath(id), io::MapOptions{.create_size = bytes}));
  *made = absl::Now() - making;
  return std::shared_ptr<io::MappedFile>(std::move(mapped));
}

absl::Status StagingArena::Release(const SlotId& id) {
  constexpr size_t kMaxFreeSlots = 4;
  std::string unlink = SlotPath(id);
  {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(id);
    if (it == slots_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no staging slot for ", Describe(id)));
    }
    const uint64_t bytes = it->second.info.bytes;
    std::shared_ptr<io::MappedFile> map = std::move(it->second.map);
    slots_.erase(it);
    used_ -= bytes;
    if (free_.size() < kMaxFreeSlots) {
      // Renamed under the lock (a tmpfs rename never waits for a device): an
      // Allocate racing with this release must find the slot, or it would pay
      // for a fresh one whose pages the trainer's copy then has to clear.
      std::string keep_as =
          io::JoinPath(FreeDir(), absl::StrCat(next_free_id_++, kSlotSuffix));
      if (fs_->Rename(SlotPath(id), keep_as).ok()) {
        // Probed after the rename, never before: a reader (a restore, ckpt
        // verify) that locked the slot before this probe is seen here, and
        // one that locks it after finds its name gone (io::LockForReading)
        // and falls back. Probed first, a reader locking in between would go
        // on reading a slot that the next save writes over.
        if (!fs_->InUse(keep_as).value_or(true)) {
          free_.emplace(bytes, FreeSlot{keep_as, std::move(map), id});
          free_bytes_ += bytes;
          return absl::OkStatus();
        }
        unlink = std::move(keep_as);  // the reader keeps its pages
      }
    }
  }
  absl::Status s = fs_->Unlink(unlink);
  if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
    CKPT_LOG_WARN("releasing staging slot {}: {}", unlink, s.ToString());
  }
  return absl::OkStatus();
}

absl::StatusOr<SlotInfo> StagingArena::Find(const SlotId& id) const {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no staging slot for ", Describe(id)));
  }
  return it->second.info;
}

absl::StatusOr<std::shared_ptr<io::MappedFile>> StagingArena::Map(
    const SlotId& id) {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(id);
  if (it == slots_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no staging slot for ", Describe(id)));
  }
  if (it->second.map == nullptr) {
    // mmap without populating is cheap enough to do under the lock.
    ASSIGN_OR_RETURN(it->second.map,
                     fs_->MapFile(it->second.info.path, io::MapOptions{}));
  }
  return it->second.map;
}

absl::StatusOr<std::shared_ptr<io::MappedFile>> StagingArena::MapLiveOrReleased(
    const SlotId& id) {
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [bytes, free] : free_) {
      if (free.former == id && free.map != nullptr) return free.map;
    }
  }
  return Map(id);
}

absl::StatusOr<std::vector<SlotInfo>> StagingArena::Recover(
    const std::function<bool(const SlotInfo&)>& keep) {
  std::vector<SlotInfo> adopted;
  ASSIGN_OR_RETURN(std::vector<std::string> jobs, fs_->ListDir(options_.dir));
  for (const std::string& job : jobs) {
    std::string job_dir = io::JoinPath(options_.dir, job);
    if (job_dir == FreeDir()) continue;
    if (absl::StartsWith(job, ".")) continue;  // ckptd's lock (no job id)
    absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(job_dir);
    if (!names.ok() || !snapshot::ValidateJobId(job).ok()) {
      CKPT_LOG_WARN("staging: ignoring unexpected entry {}", job_dir);
      continue;
    }
    for (const std::string& name : *names) {
      std::string path = io::JoinPath(job_dir, name);
      SlotInfo info;
      info.id.job = job;
      info.path = path;
      absl::StatusOr<uint64_t> size = fs_->FileSize(path);
      if (!ParseSlotName(name, &info.id.step, &info.id.rank) || !size.ok() ||
          !keep(info)) {
        CKPT_LOG_INFO("staging: removing {} (not a completely staged slot)",
                      path);
        (void)fs_->Unlink(path);
        continue;
      }
      info.bytes = *size;
      absl::MutexLock lock(&mu_);
      used_ += info.bytes;
      slots_[info.id] = Slot{info, nullptr};
      adopted.push_back(info);
    }
  }
  return adopted;
}

std::optional<StagingArena::Shortage> StagingArena::Waiting() const {
  absl::MutexLock lock(&mu_);
  if (waiting_.empty()) return std::nullopt;
  const auto& [id, bytes] = *waiting_.begin();
  const uint64_t want = used_ + preparing_ + bytes;
  if (want <= options_.budget_bytes) return std::nullopt;  // about to wake
  return Shortage{id, want - options_.budget_bytes};
}

uint64_t StagingArena::ShortfallFor(uint64_t bytes) const {
  absl::MutexLock lock(&mu_);
  const uint64_t want = used_ + preparing_ + bytes;
  return want > options_.budget_bytes ? want - options_.budget_bytes : 0;
}

std::vector<SlotInfo> StagingArena::Slots() const {
  absl::MutexLock lock(&mu_);
  std::vector<SlotInfo> out;
  for (const auto& [id, slot] : slots_) out.push_back(slot.info);
  return out;
}

uint64_t StagingArena::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace ckpt::daemon
