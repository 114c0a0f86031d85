#include "daemon/persist/file_recycler.h"

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
    io::FileSystem* fs, std::string dir, size_t max_files,
    std::function<bool()> busy) {
  RETURN_IF_ERROR(fs->CreateDirs(dir));
  std::unique_ptr<FileRecycler> recycler(
      new FileRecycler(fs, std::move(dir), max_files, std::move(busy)));
  ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(recycler->dir_));
  std::vector<std::string> stale;
  {
    absl::MutexLock lock(&recycler->mu_);
    for (const std::string& name : names) {
      const std::string path = io::JoinPath(recycler->dir_, name);
      absl::StatusOr<uint64_t> size = fs->FileSize(path);
      if (!absl::EndsWith(name, kSuffix) || !size.ok() ||
          recycler->kept_.size() >= max_files) {
        stale.push_back(path);
        continue;
      }
      recycler->kept_.emplace(*size, path);
      recycler->kept_bytes_ += *size;
    }
  }
  for (const std::string& path : stale) recycler->DeleteNow(path);
  return recycler;
}

FileRecycler::~FileRecycler() {
  absl::MutexLock lock(&mu_);
  hurry_ = true;
}

std::string FileRecycler::NextName() {
  // This run's names never meet those of an earlier run.
  return io::JoinPath(dir_, absl::StrCat(run_, "-", next_++, kSuffix));
}

void FileRecycler::Retire(const std::string& path) {
  absl::StatusOr<uint64_t> size = fs_->FileSize(path);
  std::string evicted, unmoved;
  {
    absl::MutexLock lock(&mu_);
    if (size.ok() && max_files_ > 0) {
      if (kept_.size() >= max_files_) {
        // The newest file stays; of the kept ones, the size least like it
        // goes (the state of the job changed size).
        auto farthest = kept_.begin();
        auto distance = [&](uint64_t s) {
          return s > *size ? s - *size : *size - s;
        };
        for (auto it = kept_.begin(); it != kept_.end(); ++it) {
          if (distance(it->first) > distance(farthest->first)) farthest = it;
        }
        evicted = std::move(farthest->second);
        kept_bytes_ -= farthest->first;
        kept_.erase(farthest);
      }
      const std::string kept_as = NextName();
      // Renamed under the lock: a Take() that finds it finds it in place.
      if (fs_->Rename(path, kept_as).ok()) {
        kept_.emplace(*size, kept_as);
        kept_bytes_ += *size;
      } else {
        unmoved = path;
      }
    } else {
      unmoved = path;
    }
  }
  for (const std::string& p : {evicted, unmoved}) {
    if (!p.empty()) Delete(p);
  }
}

std::string FileRecycler::Take(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  // The closest size, and none more than twice as large: what the new shard
  // leaves of a larger file is truncated away, freeing those blocks, the very
  // cost recycling saves.
  auto best = kept_.end();
  auto distance = [bytes](uint64_t s) {
    return s > bytes ? s - bytes : bytes - s;
  };
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if (it->first > 2 * bytes + kStep) continue;
    // A reader that opened the shard before it was retired still reads it
    // (a restore, a replica sent to a peer): it must not be written over.
    absl::StatusOr<bool> in_use = fs_->InUse(it->second);
    if (!in_use.ok() || *in_use) continue;
    if (best == kept_.end() || distance(it->first) < distance(best->first))
      best = it;
  }
  if (best == kept_.end()) return "";
  std::string path = std::move(best->second);
  kept_bytes_ -= best->first;
  kept_.erase(best);
  return path;
}

void FileRecycler::Delete(const std::string& path) {
  {
    absl::MutexLock lock(&mu_);
    ++pending_;
  }
  deleter_->Schedule([this, path] {
    DeleteNow(path);
    absl::MutexLock lock(&mu_);
    --pending_;
  });
}

void FileRecycler::DeleteNow(const std::string& path) {
  auto hurried = [this] {
    absl::MutexLock lock(&mu_);
    return hurry_;
  };
  absl::StatusOr<uint64_t> size = fs_->FileSize(path);
  if (size.ok() && *size > kStep) {
    absl::StatusOr<std::unique_ptr<io::WritableFile>> file =
        fs_->NewWritableFile(path, io::FileOptions{.truncate = false});
    if (file.ok()) {
      for (uint64_t at = (*size - 1) / kStep * kStep; at > 0; at -= kStep) {
        // A step waits up to a second for the persists to pause.
        for (int i = 0; i < 100 && busy_ != nullptr && !hurried() && busy_();
             ++i) {
          absl::SleepFor(absl::Milliseconds(10));
        }
        if (!(*file)->Truncate(at).ok()) break;
      }
      (void)(*file)->Close();
    }
  }
  absl::Status s = fs_->Unlink(path);
  if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
    CKPT_LOG_WARN("deleting {}: {}", path, s.ToString());
  }
}

void FileRecycler::Clear() {
  std::multimap<uint64_t, std::string> kept;
  {
    absl::MutexLock lock(&mu_);
    kept.swap(kept_);
    kept_bytes_ = 0;
    hurry_ = true;
  }
  for (const auto& [size, path] : kept) Delete(path);
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_ == 0;
  };
  mu_.Await(absl::Condition(&drained));
  hurry_ = false;
}

void FileRecycler::WaitDeleted() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_ == 0;
  };
  mu_.Await(absl::Condition(&drained));
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
