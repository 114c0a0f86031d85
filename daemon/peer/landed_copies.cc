#include "daemon/peer/landed_copies.h"

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

LandedCopies::LandedCopies(io::FileSystem* local, std::string dir)
    : local_(local), dir_(std::move(dir)) {}

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
    if (local_->Exists(landed).value_or(false)) return landed;
    landing_.insert(landed);
  }
  const absl::Time start = absl::Now();
  const std::string partial = landed + ".partial";
  absl::Status written = [&]() -> absl::Status {
    RETURN_IF_ERROR(local_->CreateDirs(job_dir));
    ASSIGN_OR_RETURN(snapshot::SelfContained view,
                     snapshot::OpenSelfContained(store, path));
    RETURN_IF_ERROR(snapshot::WriteSelfContained(local_, view, partial));
    return local_->Rename(partial, landed);
  }();
  {
    absl::MutexLock lock(&mu_);
    landing_.erase(landed);
  }
  if (!written.ok()) {
    (void)local_->Unlink(partial);
    return absl::Status(written.code(),
                        absl::StrCat(what, ": landing its copy from ", path,
                                     ": ", written.message()));
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const uint64_t bytes = local_->FileSize(landed).value_or(0);
  CKPT_LOG_INFO("{}: landed {} bytes from {} in {:.1f} ms, {:.0f} MiB/s", what,
                bytes, path, seconds * 1e3,
                seconds > 0 ? bytes / seconds / (1 << 20) : 0.0);
  return landed;
}

void LandedCopies::Forget(const std::string& job, uint64_t oldest_kept) {
  absl::MutexLock lock(&mu_);
  const std::string job_dir = io::JoinPath(dir_, job);
  absl::StatusOr<std::vector<std::string>> names = local_->ListDir(job_dir);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    uint64_t step = 0;
    const std::string landed =
        io::JoinPath(job_dir, std::string(absl::StripSuffix(name, ".partial")));
    if (landing_.count(landed) > 0) continue;
    if (!StepOfLanded(name, &step) || step < oldest_kept) {
      (void)local_->Unlink(io::JoinPath(job_dir, name));
    }
  }
}

}  // namespace ckpt::daemon
