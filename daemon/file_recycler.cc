#include "daemon/file_recycler.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "io/logging.h"
#include "io/status_macros.h"

namespace ckpt::daemon {
namespace {

constexpr char kSuffix[] = ".recycled";

}  // namespace

absl::StatusOr<std::unique_ptr<FileRecycler>> FileRecycler::Open(
    io::FileSystem* fs, std::string dir, size_t max_files) {
  RETURN_IF_ERROR(fs->CreateDirs(dir));
  std::unique_ptr<FileRecycler> recycler(
      new FileRecycler(fs, std::move(dir), max_files));
  ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(recycler->dir_));
  absl::MutexLock lock(&recycler->mu_);
  for (const std::string& name : names) {
    const std::string path = io::JoinPath(recycler->dir_, name);
    absl::StatusOr<uint64_t> size = fs->FileSize(path);
    if (!absl::EndsWith(name, kSuffix) || !size.ok() ||
        recycler->kept_.size() >= max_files) {
      (void)fs->Unlink(path);
      continue;
    }
    recycler->kept_.emplace(*size, path);
    recycler->kept_bytes_ += *size;
  }
  return recycler;
}

std::string FileRecycler::NextName() {
  // This run's names never meet those of an earlier run.
  return io::JoinPath(dir_, absl::StrCat(run_, "-", next_++, kSuffix));
}

void FileRecycler::Retire(const std::string& path) {
  absl::StatusOr<uint64_t> size = fs_->FileSize(path);
  std::string kept_as;
  {
    absl::MutexLock lock(&mu_);
    if (size.ok() && kept_.size() < max_files_) {
      kept_as = NextName();
      // Renamed under the lock: a Take() that finds it finds it in place.
      if (fs_->Rename(path, kept_as).ok()) {
        kept_.emplace(*size, kept_as);
        kept_bytes_ += *size;
        return;
      }
    }
  }
  absl::Status s = fs_->Unlink(path);
  if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
    CKPT_LOG_WARN("deleting {}: {}", path, s.ToString());
  }
}

std::string FileRecycler::Take(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (kept_.empty()) return "";
  auto it = kept_.lower_bound(bytes);
  if (it == kept_.end()) it = std::prev(kept_.end());
  std::string path = std::move(it->second);
  kept_bytes_ -= it->first;
  kept_.erase(it);
  return path;
}

void FileRecycler::Clear() {
  std::multimap<uint64_t, std::string> kept;
  {
    absl::MutexLock lock(&mu_);
    kept.swap(kept_);
    kept_bytes_ = 0;
  }
  for (const auto& [size, path] : kept) (void)fs_->Unlink(path);
}

size_t FileRecycler::files() const {
  absl::MutexLock lock(&mu_);
  return kept_.size();
}

uint64_t FileRecycler::bytes() const {
  absl::MutexLock lock(&mu_);
  return kept_bytes_;
}

}  // namespace ckpt::daemon
