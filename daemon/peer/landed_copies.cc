#include "daemon/peer/landed_copies.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/common/describe.h"
#include "io/logging.h"
#include "io/status_macros.h"
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
                           uint64_t budget_bytes, Metrics* metrics)
    : local_(local),
      dir_(std::move(dir)),
      budget_bytes_(budget_bytes),
      metrics_(metrics) {
  if (metrics_ != nullptr) {
    metrics_->Declare("ckpt_shared_landed_bytes_total", Metrics::Type::kCounter,
                      "bytes read from the object store into landed copies "
                      "for restores");
  }
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
                                               uint64_t step, uint32_t rank,
                                               How how) {
  const std::string what = Describe(job, step, rank);
  auto failed = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(what, ": landing its copy from ",
                                               path, ": ", s.message()));
  };
  absl::StatusOr<uint64_t> manifest = snapshot::ManifestChecksumOf(store, path);
  if (!manifest.ok()) return failed(manifest.status());
  const std::string local =
      io::JoinPath(io::JoinPath(dir_, job), LandedName(step, rank, *manifest));
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<CopyLanding>> landing =
      Start(store, path, local);
  if (!landing.ok()) return failed(landing.status());
  if (how == How::kWhole && *landing != nullptr) {
    const uint64_t size = (*landing)->size();
    if (absl::Status s = Ensure(local, *landing, 0, size); !s.ok()) {
      return failed(s);
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    CKPT_LOG_INFO("{}: landed {} bytes from {} in {:.1f} ms, {:.0f} MiB/s",
                  what, size, path, seconds * 1e3,
                  seconds > 0 ? size / seconds / (1 << 20) : 0.0);
  }
  return local;
}

absl::StatusOr<std::shared_ptr<CopyLanding>> LandedCopies::Start(
    io::FileSystem* store, const std::string& path, const std::string& local) {
  {
    absl::MutexLock lock(&mu_);
    auto free = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return starting_.count(local) == 0;
    };
    mu_.Await(absl::Condition(&free));
    auto it = landed_.find(local);
    if (it != landed_.end()) {
      if (local_->Exists(local).value_or(false)) {
        it->second.used = ++clock_;
        return it->second.landing;
      }
      Remove(local);
    }
    starting_.insert(local);
  }
  uint64_t reserved = 0;
  absl::StatusOr<std::unique_ptr<CopyLanding>> started =
      [&]() -> absl::StatusOr<std::unique_ptr<CopyLanding>> {
    RETURN_IF_ERROR(local_->CreateDirs(io::DirName(local)));
    return CopyLanding::Start(store, path, local_, local, [&](uint64_t size) {
      absl::MutexLock lock(&mu_);
      MakeRoom(size);
      held_ += reserved = size;
    });
  }();
  absl::MutexLock lock(&mu_);
  starting_.erase(local);
  if (!started.ok()) {
    held_ -= reserved;
    if (reserved > 0) (void)local_->Unlink(local);
    return started.status();
  }
  std::shared_ptr<CopyLanding> landing = *std::move(started);
  landed_[local] = {reserved, ++clock_, landing};
  Fetched(landing->landed_bytes());  // its footer and manifest
  CKPT_LOG_INFO(
      "landing {} ({} bytes) from {}: its footer and manifest are "
      "there, the rest lands as it is read",
      local, landing->size(), path);
  return landing;
}

absl::Status LandedCopies::LandRange(const std::string& local,
                                     const std::string& job, uint64_t step,
                                     uint32_t rank, uint64_t offset,
                                     uint64_t length) {
  const std::string what = Describe(job, step, rank);
  std::shared_ptr<CopyLanding> landing;
  {
    absl::MutexLock lock(&mu_);
    auto it = landed_.find(local);
    const std::string named =
        absl::StrFormat("%s/%020d-%010d-", io::JoinPath(dir_, job), step, rank);
    if (it == landed_.end() || !absl::StartsWith(local, named)) {
      return absl::NotFoundError(absl::StrCat(
          what, ": no copy of it is landed at ", local,
          " (removed to make room, or by retention): restore again"));
    }
    const uint64_t size = it->second.bytes;
    if (offset > size || length > size - offset) {
      return absl::OutOfRangeError(
          absl::StrCat(what, ": bytes ", offset, " to ", offset + length,
                       " of its landed copy ", local, ", of ", size, " bytes"));
    }
    it->second.used = ++clock_;
    landing = it->second.landing;
  }
  if (landing == nullptr) return absl::OkStatus();  // whole
  absl::Status s = Ensure(local, landing, offset, length);
  if (s.ok()) return s;
  return absl::Status(
      s.code(), absl::StrCat(what, ": landing bytes ", offset, " to ",
                             offset + length, " of its copy: ", s.message()));
}

absl::Status LandedCopies::Ensure(const std::string& local,
                                  const std::shared_ptr<CopyLanding>& landing,
                                  uint64_t offset, uint64_t length) {
  ASSIGN_OR_RETURN(uint64_t read, landing->Ensure(offset, length));
  const bool whole = landing->whole();
  Fetched(read);
  absl::MutexLock lock(&mu_);
  auto it = landed_.find(local);
  if (whole && it != landed_.end() && it->second.landing == landing) {
    it->second.landing.reset();  // its view and mapping go
  }
  return absl::OkStatus();
}

void LandedCopies::Fetched(uint64_t bytes) {
  if (bytes == 0) return;
  fetched_.fetch_add(bytes);
  if (metrics_ != nullptr) {
    metrics_->Add("ckpt_shared_landed_bytes_total", {},
                  static_cast<double>(bytes));
  }
}

uint64_t LandedCopies::fetched_bytes() const { return fetched_.load(); }

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
    if (starting_.count(path) > 0) continue;
    if (!StepOfLanded(name, &step) || step < oldest_kept) {
      Remove(path);                // a copy it counts
      (void)local_->Unlink(path);  // or one it does not
    }
  }
}

}  // namespace ckpt::daemon
