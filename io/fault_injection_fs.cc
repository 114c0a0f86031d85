#include "io/fault_injection_fs.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "io/errno_status.h"
#include "io/status_macros.h"

namespace ckpt::io {
namespace {

// An injected short write: the first half of the data (aligned down) reaches
// the file before the device gives up.
size_t ShortPrefix(size_t size) {
  return size / 2 / kDirectIoAlignment * kDirectIoAlignment;
}

}  // namespace

class FaultInjectionFs::File final : public WritableFile {
 public:
  File(FaultInjectionFs* fs, std::unique_ptr<WritableFile> base, int inode)
      : fs_(fs), base_(std::move(base)), inode_(inode) {}

  absl::Status Write(uint64_t offset, AlignedBuffer buffer) override {
    fs_->Throttle(buffer.size());
    bool short_write = false;
    int err = 0;
    RETURN_IF_ERROR(fs_->OnWrite(inode_, path(), offset, buffer.span(),
                                 &short_write, &err));
    if (!short_write) return base_->Write(offset, std::move(buffer));
    const size_t prefix = ShortPrefix(buffer.size());
    if (prefix > 0) {
      buffer.set_size(prefix);
      (void)base_->Write(offset, std::move(buffer));
    }
    return ShortWrite(offset, err);
  }
  absl::Status WriteBorrowed(uint64_t offset,
                             absl::Span<const uint8_t> bytes) override {
    fs_->Throttle(bytes.size());
    bool short_write = false;
    int err = 0;
    RETURN_IF_ERROR(
        fs_->OnWrite(inode_, path(), offset, bytes, &short_write, &err));
    if (!short_write) return base_->WriteBorrowed(offset, bytes);
    const size_t prefix = ShortPrefix(bytes.size());
    if (prefix > 0) (void)base_->WriteBorrowed(offset, bytes.first(prefix));
    return ShortWrite(offset, err);
  }
  absl::Status Flush() override { return base_->Flush(); }
  absl::Status Allocate(uint64_t size) override {
    RETURN_IF_ERROR(fs_->OnMetadata(absl::StrCat("fallocate ", path())));
    RETURN_IF_ERROR(fs_->PersistentWriteFault(path()));
    RETURN_IF_ERROR(base_->Allocate(size));
    fs_->OnResize(inode_, size, /*shrink=*/false);
    return absl::OkStatus();
  }
  absl::Status Truncate(uint64_t size) override {
    RETURN_IF_ERROR(fs_->OnMetadata(absl::StrCat("ftruncate ", path())));
    RETURN_IF_ERROR(base_->Truncate(size));
    fs_->OnResize(inode_, size, /*shrink=*/true);
    return absl::OkStatus();
  }
  absl::Status Sync() override { return SyncImpl(false); }
  absl::Status DataSync() override { return SyncImpl(true); }
  absl::Status Close() override { return base_->Close(); }
  const std::string& path() const override { return base_->path(); }

 private:
  absl::Status ShortWrite(uint64_t offset, int err) {
    (void)base_->Flush();
    return ErrnoToStatus(err, absl::StrCat("write ", path(), " at offset ",
                                           offset, " (injected short write)"));
  }

  absl::Status SyncImpl(bool data_only) {
    RETURN_IF_ERROR(base_->Flush());
    int inject_err = 0;
    RETURN_IF_ERROR(fs_->BeforeSync(path(), &inject_err));
    if (inject_err != 0) return fs_->OnSync(inode_, path(), inject_err);
    absl::Status s = data_only ? base_->DataSync() : base_->Sync();
    RETURN_IF_ERROR(s);
    return fs_->OnSync(inode_, path(), 0);
  }

  FaultInjectionFs* const fs_;
  std::unique_ptr<WritableFile> base_;
  const int inode_;
};

FaultInjectionFs::FaultInjectionFs(FileSystem* base) : base_(base) {}
FaultInjectionFs::~FaultInjectionFs() = default;

void FaultInjectionFs::FailWriteAt(int n, int err) {
  absl::MutexLock l(&mu_);
  fail_write_ = {n, err};
}
void FaultInjectionFs::ShortWriteAt(int n, int err) {
  absl::MutexLock l(&mu_);
  short_write_ = {n, err};
}
void FaultInjectionFs::FailSyncAt(int n, int err) {
  absl::MutexLock l(&mu_);
  fail_sync_ = {n, err};
}
void FaultInjectionFs::FailSyncDirAt(int n, int err) {
  absl::MutexLock l(&mu_);
  fail_sync_dir_ = {n, err};
}
void FaultInjectionFs::SetPersistentFaults(int write_err, int sync_err) {
  absl::MutexLock l(&mu_);
  persistent_write_err_ = write_err;
  persistent_sync_err_ = sync_err;
}
void FaultInjectionFs::DisableDurabilityModel() {
  absl::MutexLock l(&mu_);
  model_durability_ = false;
}
void FaultInjectionFs::ModelDurabilityByJournal() {
  absl::MutexLock l(&mu_);
  model_durability_ = false;
  journal_model_ = true;
}
absl::StatusOr<std::string> FaultInjectionFs::CutPower() {
  absl::MutexLock l(&mu_);
  if (!journal_model_) {
    return absl::FailedPreconditionError(
        "the power can be cut only under the journal durability model "
        "(ModelDurabilityByJournal)");
  }
  power_out_ = true;
  return journal_.Plan();
}
void FaultInjectionFs::OnResize(int inode, uint64_t size, bool shrink) {
  absl::MutexLock l(&mu_);
  if (journal_model_) journal_.Resized(inode, size, shrink);
}
absl::Status FaultInjectionFs::PersistentWriteFault(const std::string& path) {
  absl::MutexLock l(&mu_);
  if (persistent_write_err_ == 0) return absl::OkStatus();
  return ErrnoToStatus(persistent_write_err_,
                       absl::StrCat("fallocate ", path, " (injected)"));
}
void FaultInjectionFs::PowerLossAfter(int n) {
  absl::MutexLock l(&mu_);
  power_loss_after_ = n;
}
void FaultInjectionFs::EnableTornWrites(uint64_t seed) {
  absl::MutexLock l(&mu_);
  torn_ = true;
  rng_.seed(seed);
}
int FaultInjectionFs::writes() const {
  absl::MutexLock l(&mu_);
  return writes_;
}
int FaultInjectionFs::syncs() const {
  absl::MutexLock l(&mu_);
  return syncs_;
}
int FaultInjectionFs::mutations() const {
  absl::MutexLock l(&mu_);
  return mutations_;
}

absl::Status FaultInjectionFs::BeginMutation(absl::string_view what) {
  ++mutations_;
  if (power_out_) {
    return ErrnoToStatus(EIO, absl::StrCat(what, " (the power is out)"));
  }
  if (power_loss_after_ >= 0 && mutations_ > power_loss_after_) {
    return ErrnoToStatus(EIO, absl::StrCat(what, " (simulated power loss)"));
  }
  return absl::OkStatus();
}

void FaultInjectionFs::TrackDir(const std::string& dir) {
  if (durable_dirs_.count(dir) != 0) return;
  std::map<std::string, int>& entries = durable_dirs_[dir];
  absl::StatusOr<std::vector<std::string>> names = base_->ListDir(dir);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    std::string path = JoinPath(dir, name);
    absl::StatusOr<std::string> contents = ReadFileToString(base_, path);
    if (!contents.ok()) continue;  // a directory or unreadable: not modelled
    int id = next_inode_++;
    inodes_[id].durable = *std::move(contents);
    entries[name] = id;
    current_[path] = id;
  }
}

std::string FaultInjectionFs::PathOf(int inode) const {
  for (const auto& [path, id] : current_) {
    if (id == inode) return path;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionFs::NewWritableFile(
    const std::string& path, const FileOptions& options) {
  int inode;
  {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(BeginMutation(absl::StrCat("create ", path)));
    if (journal_model_) {
      // Opened under the lock: CutPower sees every creation or none.
      absl::StatusOr<uint64_t> size = base_->FileSize(path);
      ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> base,
                       base_->NewWritableFile(path, options));
      const int id = journal_.Opened(
          path, size.ok() ? static_cast<int64_t>(*size) : -1, options.truncate);
      return std::unique_ptr<WritableFile>(new File(this, std::move(base), id));
    }
    TrackDir(DirName(path));
    auto it = current_.find(path);
    if (it != current_.end()) {
      inode = it->second;  // O_TRUNC keeps the inode; its durable data changes
                           // only on fsync
    } else {
      inode = next_inode_++;
      inodes_[inode];
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> base,
                   base_->NewWritableFile(path, options));
  absl::MutexLock l(&mu_);
  current_[path] = inode;
  return std::unique_ptr<WritableFile>(new File(this, std::move(base), inode));
}

absl::StatusOr<std::unique_ptr<ReadableFile>> FaultInjectionFs::NewReadableFile(
    const std::string& path, const FileOptions& options) {
  return base_->NewReadableFile(path, options);
}

void FaultInjectionFs::SetWriteThroughput(uint64_t bytes_per_second) {
  absl::MutexLock l(&mu_);
  write_bytes_per_second_ = bytes_per_second;
}

void FaultInjectionFs::Throttle(uint64_t bytes) {
  uint64_t rate;
  {
    absl::MutexLock l(&mu_);
    rate = write_bytes_per_second_;
  }
  if (rate > 0) {
    absl::SleepFor(
        absl::Seconds(static_cast<double>(bytes) / static_cast<double>(rate)));
  }
}

absl::Status FaultInjectionFs::OnWrite(int inode, const std::string& path,
                                       uint64_t offset,
                                       absl::Span<const uint8_t> bytes,
                                       bool* short_write, int* err) {
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(
      BeginMutation(absl::StrCat("write ", path, " at offset ", offset)));
  ++writes_;
  if (fail_write_.at == writes_ || persistent_write_err_ != 0) {
    return ErrnoToStatus(
        fail_write_.at == writes_ ? fail_write_.err : persistent_write_err_,
        absl::StrCat("write ", path, " at offset ", offset, " (injected)"));
  }
  if (journal_model_) {
    journal_.Wrote(inode, offset, bytes.size());
    if (short_write_.at == writes_) {
      *short_write = true;
      *err = short_write_.err;
    }
    return absl::OkStatus();
  }
  if (!model_durability_) return absl::OkStatus();
  Inode& node = inodes_[inode];
  if (short_write_.at == writes_) {
    *short_write = true;
    *err = short_write_.err;
    const size_t prefix = ShortPrefix(bytes.size());
    node.unsynced.emplace_back(
        offset,
        std::string(reinterpret_cast<const char*>(bytes.data()), prefix));
    return absl::OkStatus();
  }
  node.unsynced.emplace_back(
      offset,
      std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  return absl::OkStatus();
}

absl::Status FaultInjectionFs::OnMetadata(absl::string_view what) {
  absl::MutexLock l(&mu_);
  return BeginMutation(what);
}

absl::Status FaultInjectionFs::BeforeSync(const std::string& path,
                                          int* inject_err) {
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(BeginMutation(absl::StrCat("fsync ", path)));
  ++syncs_;
  *inject_err = fail_sync_.at == syncs_ ? fail_sync_.err : persistent_sync_err_;
  return absl::OkStatus();
}

absl::Status FaultInjectionFs::OnSync(int inode, const std::string& path,
                                      int injected_err) {
  absl::MutexLock l(&mu_);
  if (power_out_) {
    // The power went out during the fsync: it did not reach the disk.
    return ErrnoToStatus(EIO,
                         absl::StrCat("fsync ", path, " (the power is out)"));
  }
  if (journal_model_) {
    if (injected_err == 0) {
      journal_.Synced(inode);
      return absl::OkStatus();
    }
    journal_.SyncFailed(inode);
    return ErrnoToStatus(injected_err,
                         absl::StrCat("fsync ", path, " (injected)"));
  }
  Inode& node = inodes_[inode];
  if (injected_err != 0) {
    // Linux marks the failed pages clean: the data never reaches the disk, and
    // a later fsync reports success without writing it.
    node.poisoned = true;
    node.unsynced.clear();
    return ErrnoToStatus(injected_err,
                         absl::StrCat("fsync ", path, " (injected)"));
  }
  if (node.poisoned || !model_durability_) return absl::OkStatus();
  std::string current_path = PathOf(inode);
  if (current_path.empty()) return absl::OkStatus();  // unlinked
  absl::StatusOr<std::string> contents = ReadFileToString(base_, current_path);
  if (!contents.ok()) return contents.status();
  node.durable = *std::move(contents);
  node.unsynced.clear();
  return absl::OkStatus();
}

absl::Status FaultInjectionFs::HardLink(const std::string& existing,
                                        const std::string& link) {
  RETURN_IF_ERROR(PersistentWriteFault(link));
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(BeginMutation(absl::StrCat("link ", existing, " to ", link)));
  RETURN_IF_ERROR(base_->HardLink(existing, link));
  if (journal_model_) journal_.Linked(link);
  return absl::OkStatus();
}

void FaultInjectionFs::BeforeRename(
    std::function<void(const std::string& from)> hook) {
  absl::MutexLock l(&mu_);
  before_rename_ = std::move(hook);
}

absl::Status FaultInjectionFs::Rename(const std::string& from,
                                      const std::string& to) {
  std::function<void(const std::string&)> hook;
  {
    absl::MutexLock l(&mu_);
    hook = before_rename_;
  }
  if (hook) hook(from);
  {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(BeginMutation(absl::StrCat("rename ", from, " to ", to)));
    if (journal_model_) {
      // The name the rename replaces is kept until `to`'s directory is
      // synced: a power loss before brings it back.
      std::string kept;
      absl::StatusOr<bool> exists = base_->Exists(to);
      if (exists.ok() && *exists) {
        kept = UnsyncedJournal::KeptLinkName(to, ++kept_links_);
        RETURN_IF_ERROR(base_->HardLink(to, kept));
      }
      absl::Status s = base_->Rename(from, to);
      if (!s.ok()) {
        if (!kept.empty()) (void)base_->Unlink(kept);
        return s;
      }
      journal_.Renamed(from, to, kept);
      return absl::OkStatus();
    }
    TrackDir(DirName(from));
    TrackDir(DirName(to));
  }
  RETURN_IF_ERROR(base_->Rename(from, to));
  absl::MutexLock l(&mu_);
  auto it = current_.find(from);
  if (it != current_.end()) {
    int inode = it->second;
    current_.erase(it);
    current_[to] = inode;
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionFs::SyncDir(const std::string& dir) {
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(BeginMutation(absl::StrCat("fsync directory ", dir)));
  ++dir_syncs_;
  if (fail_sync_dir_.at == dir_syncs_) {
    return ErrnoToStatus(fail_sync_dir_.err,
                         absl::StrCat("fsync directory ", dir, " (injected)"));
  }
  RETURN_IF_ERROR(base_->SyncDir(dir));
  if (journal_model_) {
    for (const std::string& kept : journal_.DirSynced(dir)) {
      (void)base_->Unlink(kept);
    }
    return absl::OkStatus();
  }
  TrackDir(dir);
  std::map<std::string, int> entries;
  for (const auto& [path, inode] : current_) {
    if (DirName(path) == dir) entries[BaseName(path)] = inode;
  }
  durable_dirs_[dir] = std::move(entries);
  return absl::OkStatus();
}

absl::Status FaultInjectionFs::Unlink(const std::string& path) {
  {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(BeginMutation(absl::StrCat("unlink ", path)));
    if (journal_model_) {
      RETURN_IF_ERROR(base_->Unlink(path));
      journal_.Unlinked(path);
      return absl::OkStatus();
    }
    TrackDir(DirName(path));
  }
  RETURN_IF_ERROR(base_->Unlink(path));
  absl::MutexLock l(&mu_);
  current_.erase(path);
  return absl::OkStatus();
}

absl::Status FaultInjectionFs::CreatePrivateDirs(const std::string& path) {
  return base_->CreatePrivateDirs(path);
}

absl::Status FaultInjectionFs::RemoveDir(const std::string& path) {
  return base_->RemoveDir(path);
}

absl::Status FaultInjectionFs::CreateDirs(const std::string& path) {
  return base_->CreateDirs(path);
}
absl::StatusOr<std::vector<std::string>> FaultInjectionFs::ListDir(
    const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, base_->ListDir(dir));
  absl::MutexLock l(&mu_);
  if (journal_model_) {
    names.erase(
        std::remove_if(names.begin(), names.end(), UnsyncedJournal::IsKeptLink),
        names.end());
  }
  return names;
}
absl::StatusOr<uint64_t> FaultInjectionFs::FileSize(const std::string& path) {
  return base_->FileSize(path);
}
absl::StatusOr<bool> FaultInjectionFs::Exists(const std::string& path) {
  return base_->Exists(path);
}
absl::StatusOr<FileId> FaultInjectionFs::GetFileId(const std::string& path) {
  return base_->GetFileId(path);
}

absl::StatusOr<bool> FaultInjectionFs::InUse(const std::string& path) {
  return base_->InUse(path);
}

absl::StatusOr<uint64_t> FaultInjectionFs::FreeSpace(const std::string& path) {
  return base_->FreeSpace(path);
}

absl::StatusOr<std::unique_ptr<MappedFile>> FaultInjectionFs::MapFile(
    const std::string& path, const MapOptions& options) {
  return base_->MapFile(path, options);
}

absl::StatusOr<UniqueFd> FaultInjectionFs::OpenForWritingInPlace(
    const std::string& path) {
  {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(BeginMutation(absl::StrCat("open for writing ", path)));
  }
  return base_->OpenForWritingInPlace(path);
}

std::string FaultInjectionFs::TornContents(const Inode& node) {
  std::string contents = node.durable;
  if (!torn_ || node.unsynced.empty()) return contents;
  size_t keep =
      std::uniform_int_distribution<size_t>(0, node.unsynced.size())(rng_);
  for (size_t i = 0; i < keep; ++i) {
    const auto& [offset, data] = node.unsynced[i];
    absl::string_view piece = data;
    if (i + 1 == keep) {
      size_t sectors = piece.size() / 512;
      piece = piece.substr(
          0, std::uniform_int_distribution<size_t>(0, sectors)(rng_) * 512);
    }
    if (contents.size() < offset + piece.size())
      contents.resize(offset + piece.size(), '\0');
    std::memcpy(contents.data() + offset, piece.data(), piece.size());
  }
  return contents;
}

absl::Status FaultInjectionFs::SimulatePowerLoss() {
  absl::MutexLock l(&mu_);
  if (!model_durability_) {
    return absl::FailedPreconditionError(
        "power loss cannot be simulated: the durability model is disabled");
  }
  absl::Status result;
  for (const auto& [dir, entries] : durable_dirs_) {
    for (auto it = current_.begin(); it != current_.end();) {
      if (DirName(it->first) == dir) {
        absl::Status s = base_->Unlink(it->first);
        if (!s.ok() && result.ok()) result = s;
        it = current_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto& [name, inode] : entries) {
      std::string path = JoinPath(dir, name);
      absl::Status s =
          WriteStringToFile(base_, path, TornContents(inodes_[inode]));
      if (!s.ok() && result.ok()) result = s;
      current_[path] = inode;
    }
  }
  for (auto& [id, node] : inodes_) {
    node.unsynced.clear();
    node.poisoned = false;
  }
  // What was written by a torn power loss is now the durable state.
  for (const auto& [path, inode] : current_) {
    absl::StatusOr<std::string> contents = ReadFileToString(base_, path);
    if (contents.ok()) inodes_[inode].durable = *std::move(contents);
  }
  writes_ = syncs_ = dir_syncs_ = mutations_ = 0;
  fail_write_ = short_write_ = fail_sync_ = fail_sync_dir_ = Fault{};
  power_loss_after_ = -1;
  return result;
}

}  // namespace ckpt::io
