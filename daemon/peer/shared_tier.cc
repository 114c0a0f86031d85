#include "daemon/peer/shared_tier.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/common/describe.h"
#include "daemon/peer/replica_store.h"
#include "daemon/persist/retention.h"
#include "io/aligned_buffer.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"
#include "snapshot/self_contained.h"

namespace ckpt::daemon {
namespace {

constexpr int kAttempts = 5;

// The step of "<step:020>-<rank:010>.ckpt".
bool StepOf(absl::string_view name, uint64_t* step) {
  if (!absl::ConsumeSuffix(&name, ".ckpt")) return false;
  std::vector<absl::string_view> parts = absl::StrSplit(name, '-');
  return parts.size() == 2 && parts[0].size() == 20 &&
         absl::SimpleAtoi(parts[0], step);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedTier>> SharedTier::Start(
    io::FileSystem* fs, SharedTierOptions options, Metrics* metrics,
    OnCopied on_copied) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("the shared directory is empty");
  }
  if (options.every == 0 || options.keep < 1) {
    return absl::InvalidArgumentError(
        "the shared tier needs --shared-every >= 1 and --keep-shared >= 1");
  }
  RETURN_IF_ERROR(fs->CreateDirs(options.dir));
  std::unique_ptr<SharedTier> tier(
      new SharedTier(fs, std::move(options), metrics, std::move(on_copied)));
  using T = Metrics::Type;
  metrics->Declare("ckpt_shared_bytes_total", T::kCounter,
                   "shard-file bytes copied to the shared tier");
  metrics->Declare("ckpt_shared_failures_total", T::kCounter,
                   "copies to the shared tier that failed");
  SharedTier* self = tier.get();
  tier->thread_ = std::thread([self] { self->Loop(); });
  return tier;
}

SharedTier::SharedTier(io::FileSystem* fs, SharedTierOptions options,
                       Metrics* metrics, OnCopied on_copied)
    : fs_(fs),
      options_(std::move(options)),
      metrics_(metrics),
      on_copied_(std::move(on_copied)) {}

SharedTier::~SharedTier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::string SharedTier::PathOf(const std::string& job, uint64_t step,
                               uint32_t rank) const {
  char name[64];
  std::snprintf(name, sizeof(name), "%020" PRIu64 "-%010" PRIu32 ".ckpt", step,
                rank);
  return io::JoinPath(io::JoinPath(options_.dir, job), name);
}

void SharedTier::Enqueue(const proto::ShardRecord& shard) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(shard);
}

void SharedTier::Loop() {
  while (true) {
    proto::ShardRecord shard;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      shard = std::move(queue_.front());
      queue_.pop_front();
    }
    const std::string what = Describe(shard.job(), shard.step(), shard.rank());
    absl::Status copied;
    for (int attempt = 1; attempt <= kAttempts; ++attempt) {
      copied = Copy(shard);
      if (copied.ok() || absl::IsNotFound(copied)) break;
      metrics_->Add("ckpt_shared_failures_total", {{"job", shard.job()}});
      CKPT_LOG_WARN("{}: copy to the shared tier (attempt {} of {}): {}", what,
                    attempt, kAttempts, copied.ToString());
      absl::SleepFor(absl::Seconds(attempt));
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (copied.ok()) {
      on_copied_(shard);
    } else if (absl::IsNotFound(copied)) {
      // Garbage collection dropped the local file first: nothing to copy.
      CKPT_LOG_INFO("{}: not copied to the shared tier: {}", what,
                    copied.ToString());
    }
  }
}

absl::Status SharedTier::Copy(const proto::ShardRecord& shard) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(shard.job()));
  const std::string path = PathOf(shard.job(), shard.step(), shard.rank());
  const std::string partial = path + ".partial";
  // Self-contained: an incremental save's unchanged chunks come from its
  // bases, so the copy stands alone on the shared tier.
  ASSIGN_OR_RETURN(snapshot::SelfContained view,
                   snapshot::OpenSelfContained(fs_, shard.shard_path()));
  const uint64_t size = view.size;
  RETURN_IF_ERROR(fs_->CreateDirs(io::DirName(path)));
  RETURN_IF_ERROR(snapshot::WriteSelfContained(fs_, view, partial));
  CKPT_KILL_POINT("shared.before_rename");
  RETURN_IF_ERROR(fs_->Rename(partial, path));
  RETURN_IF_ERROR(fs_->SyncDir(io::DirName(path)));
  metrics_->Add("ckpt_shared_bytes_total", {{"job", shard.job()}},
                static_cast<double>(size));
  return absl::OkStatus();
}

bool SharedTier::Has(const std::string& job, uint64_t step, uint32_t rank) {
  return snapshot::ValidateJobId(job).ok() &&
         fs_->Exists(PathOf(job, step, rank)).value_or(false);
}

absl::StatusOr<proto::ShardRecord> SharedTier::Find(const std::string& job,
                                                    uint64_t step,
                                                    uint32_t rank) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  const std::string path = PathOf(job, step, rank);
  absl::StatusOr<uint64_t> size = fs_->FileSize(path);
  if (!size.ok()) {
    return absl::NotFoundError(
        absl::StrCat("no copy of ", Describe(job, step, rank),
                     " in the shared tier ", options_.dir));
  }
  return ReplicaStore::RecordOf(fs_, {{job, step, rank}, path, *size});
}

void SharedTier::CollectGarbage(
    const std::string& job, const std::vector<proto::CommitRecord>& commits) {
  std::vector<uint64_t> steps;
  for (const proto::CommitRecord& c : commits) {
    if (c.tier() == proto::TIER_SHARED) steps.push_back(c.step());
  }
  if (steps.empty()) return;
  std::sort(steps.rbegin(), steps.rend());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  const uint64_t oldest_kept =
      steps[std::min(steps.size(), static_cast<size_t>(options_.keep)) - 1];
  const std::string job_dir = io::JoinPath(options_.dir, job);
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(job_dir);
  if (!names.ok()) return;
  std::set<uint64_t> dropped;
  for (const std::string& name : *names) {
    uint64_t step = 0;
    // Partial files of a copy cut short are left to the next copy of that
    // shard (it truncates them): another node may be writing one now.
    if (StepOf(name, &step) && step < oldest_kept) {
      (void)fs_->Unlink(io::JoinPath(job_dir, name));
      dropped.insert(step);
    }
  }
  if (!dropped.empty()) {
    CKPT_LOG_INFO(
        "shared tier, job {}: copies of steps {} dropped; it keeps "
        "steps from {}",
        job, StepList(dropped), oldest_kept);
  }
}

}  // namespace ckpt::daemon
