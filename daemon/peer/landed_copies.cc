#include "daemon/peer/landed_copies.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "daemon/common/describe.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/self_contained.h"
#include "snapshot/shard_reader.h"

namespace ckpt::daemon {
namespace {

// "<step:020>-<rank:010>-<manifest:016x>.ckpt"
std::string LandedName(uint64_t step, uint32_t rank, uint64_t manifest) {
  return absl::StrFormat("%020d-%010d-%016x.ckpt", step, rank, manifest);
}

bool StepOfLanded(const std::string& name, uint64_t* step) {
  return name.size() > 20 && name[20] == '-' &&
         absl::SimpleAtoi(name.substr(0, 20), step);
}

}  // namespace

LandedCopies::LandedCopies(io::FileSystem* local, std::string dir,
                           uint64_t budget_bytes)
    : local_(local), dir_(std::move(dir)), budget_bytes_(budget_bytes) {
  for (const std::string& job :
       local_->ListDir(dir_).value_or(std::vector<std::string>())) {
    const std::string job_dir = io::JoinPath(dir_, job);
    for (const std::string& name :
         local_->ListDir(job_dir).value_or(std::vector<std::string>())) {
      (void)local_->Unlink(io::JoinPath(job_dir, name));
    }
    (void)local_->RemoveDir(job_dir);
  }
}

absl::StatusOr<std::string> LandedCopies::Land(io::FileSystem* store,
                                               const std::string& path,
                                               const std::string& job,
                                               uint64_t step, uint32_t rank) {
  const std::string what = Describe(job, step, rank);
  ASSIGN_OR_RETURN(uint64_t manifest,
                   snapshot::ManifestChecksumOf(store, path));
  const std::string job_dir = io::JoinPath(dir_, job);
  const std::string landed =
      io::JoinPath(job_dir, LandedName(step, rank, manifest));
  {
    absl::MutexLock lock(&mu_);
    auto free = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return landing_.count(landed) == 0;
    };
    mu_.Await(absl::Condition(&free));
    auto it = landed_.find(landed);
    if (it != landed_.end()) {
      if (local_->Exists(landed).value_or(false)) {
        it->second.used = ++clock_;
        return landed;
      }
      Remove(landed);
    }
    landing_.insert(landed);
  }
  const absl::Time start = absl::Now();
  const std::string partial = landed + ".partial";
  uint64_t reserved = 0;
  absl::Status written = [&]() -> absl::Status {
    RETURN_IF_ERROR(local_->CreateDirs(job_dir));
    ASSIGN_OR_RETURN(snapshot::SelfContained view,
                     snapshot::OpenSelfContained(store, path));
    {
      absl::MutexLock lock(&mu_);
      MakeRoom(view.size);
      held_ += reserved = view.size;
    }
    RETURN_IF_ERROR(snapshot::WriteSelfContained(local_, view, partial));
    return local_->Rename(partial, landed);
  }();
  {
    absl::MutexLock lock(&mu_);
    landing_.erase(landed);
    if (written.ok()) {
      landed_[landed] = {reserved, ++clock_};
    } else {
      held_ -= reserved;
    }
  }
  if (!written.ok()) {
    (void)local_->Unlink(partial);
    return absl::Status(written.code(),
                        absl::StrCat(what, ": landing its copy from ", path,
                                     ": ", written.message()));
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  CKPT_LOG_INFO("{}: landed {} bytes from {} in {:.1f} ms, {:.0f} MiB/s", what,
                reserved, path, seconds * 1e3,
                seconds > 0 ? reserved / seconds / (1 << 20) : 0.0);
  return landed;
}

void LandedCopies::MakeRoom(uint64_t bytes) {
  while (held_ + bytes > budget_bytes_ && !landed_.empty()) {
    auto oldest = std::min_element(landed_.begin(), landed_.end(),
                                   [](const auto& a, const auto& b) {
                                     return a.second.used < b.second.used;
                                   });
    CKPT_LOG_INFO(
        "landed copies: {} removed to make room ({} bytes held, budget {})",
        oldest->first, held_, budget_bytes_);
    Remove(oldest->first);
  }
}

void LandedCopies::Remove(const std::string& path) {
  auto it = landed_.find(path);
  if (it == landed_.end()) return;
  (void)local_->Unlink(path);
  held_ -= it->second.bytes;
  landed_.erase(it);
}

uint64_t LandedCopies::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

void LandedCopies::Forget(const std::string& job, uint64_t oldest_kept) {
  absl::MutexLock lock(&mu_);
  const std::string job_dir = io::JoinPath(dir_, job);
  absl::StatusOr<std::vector<std::string>> names = local_->ListDir(job_dir);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    uint64_t step = 0;
    const std::string path = io::JoinPath(job_dir, name);
    if (landing_.count(std::string(absl::StripSuffix(path, ".partial"))) > 0) {
      continue;
    }
    if (!StepOfLanded(name, &step) || step < oldest_kept) {
      Remove(path);                // a copy it counts
      (void)local_->Unlink(path);  // or one it does not (a partial file)
    }
  }
}

}  // namespace ckpt::daemon
