#include "daemon/peer/shared_tier.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "daemon/common/describe.h"
#include "daemon/peer/replica_store.h"
#include "daemon/persist/retention.h"
#include "io/aligned_buffer.h"
#include "io/background.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/format.h"
#include "snapshot/names.h"
#include "snapshot/self_contained.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shared_layout.h"

namespace ckpt::daemon {
namespace {

constexpr int kAttempts = 5;

using snapshot::ParseMarkerName;
using snapshot::ParsePinName;

}  // namespace

absl::StatusOr<std::unique_ptr<SharedTier>> SharedTier::Start(
    io::FileSystem* local, SharedTierOptions options, Metrics* metrics,
    OnCopied on_copied) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("the shared directory is empty");
  }
  if (options.every == 0 || options.keep < 1) {
    return absl::InvalidArgumentError(
        "the shared tier needs --shared-every >= 1 and --keep-shared >= 1");
  }
  ASSIGN_OR_RETURN(SharedStore store,
                   OpenSharedStore(local, options.dir, options.object_store));
  if (store.object_store() && options.landing_dir.empty()) {
    return absl::InvalidArgumentError(
        "a shared tier on an object store needs a landing directory");
  }
  std::unique_ptr<SharedTier> tier(new SharedTier(local, std::move(store),
                                                  std::move(options), metrics,
                                                  std::move(on_copied)));
  using T = Metrics::Type;
  metrics->Declare("ckpt_shared_bytes_total", T::kCounter,
                   "shard-file bytes copied to the shared tier");
  metrics->Declare("ckpt_shared_failures_total", T::kCounter,
                   "copies to the shared tier that failed");
  if (tier->landed_ != nullptr) {
    metrics->Declare("ckpt_shared_landed_bytes_total", T::kCounter,
                     "bytes read from the object store into landed copies "
                     "for restores");
  }
  const SharedTierOptions& o = tier->options_;
  CKPT_LOG_INFO(
      "shared tier: {}{}, the steps that are multiples of {}, the newest {} "
      "kept",
      o.dir,
      tier->store_.object_store()
          ? absl::StrCat(" (endpoint ",
                         tier->store_.client->options().endpoint.empty()
                             ? "AWS"
                             : tier->store_.client->options().endpoint,
                         ", region ", o.object_store.region, ")")
          : "",
      o.every, o.keep);
  SharedTier* self = tier.get();
  tier->thread_ = std::thread([self] { self->Loop(); });
  return tier;
}

SharedTier::SharedTier(io::FileSystem* local, SharedStore store,
                       SharedTierOptions options, Metrics* metrics,
                       OnCopied on_copied)
    : local_(local),
      store_(std::move(store)),
      fs_(store_.fs),
      options_(std::move(options)),
      metrics_(metrics),
      on_copied_(std::move(on_copied)) {
  if (store_.object_store()) {
    landed_ = std::make_unique<LandedCopies>(
        local_, options_.landing_dir, options_.landing_budget_bytes, metrics_);
  }
}

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
  io::EnterBackground();
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
    const absl::Status copied = CopyWithRetries(shard, what);
    if (copied.ok()) {
      on_copied_(shard);
    } else if (absl::IsCancelled(copied)) {
      return;
    } else if (LocalGone(shard, copied)) {
      // Garbage collection dropped the local file first: nothing to copy.
      CKPT_LOG_INFO("{}: not copied to the shared tier: {}", what,
                    copied.ToString());
    } else {
      CKPT_LOG_ERROR(
          "{}: not copied to the shared tier, which it stays off: {}", what,
          copied.ToString());
    }
  }
}

bool SharedTier::LocalGone(const proto::ShardRecord& shard,
                           const absl::Status& copied) {
  return absl::IsNotFound(copied) &&
         !local_->Exists(shard.shard_path()).value_or(true);
}

absl::Status SharedTier::CopyWithRetries(const proto::ShardRecord& shard,
                                         const std::string& what) {
  // A store that does not answer (down, restarting, unreachable) is tried
  // for up to `retry_for`; other failures `kAttempts` times.
  const absl::Time give_up = absl::Now() + options_.retry_for;
  for (int attempt = 1;; ++attempt) {
    absl::Status copied = Copy(shard);
    if (copied.ok() || LocalGone(shard, copied)) return copied;
    metrics_->Add("ckpt_shared_failures_total", {{"job", shard.job()}});
    const bool transient =
        absl::IsUnavailable(copied) || absl::IsDeadlineExceeded(copied);
    if (transient ? absl::Now() >= give_up : attempt >= kAttempts) {
      return copied;
    }
    const absl::Duration pause =
        std::min(absl::Seconds(attempt), absl::Seconds(30));
    CKPT_LOG_WARN("{}: copy to the shared tier (attempt {}; again in {}): {}",
                  what, attempt, absl::FormatDuration(pause),
                  copied.ToString());
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_;
    };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), pause)) {
      return absl::CancelledError("ckptd is stopping");
    }
  }
}

absl::StatusOr<snapshot::SelfContained> SharedTier::Outgoing(
    const proto::ShardRecord& shard, std::vector<uint64_t>* bases) {
  bases->clear();
  bool as_is = false;
  ASSIGN_OR_RETURN(
      snapshot::SelfContained out,
      snapshot::OpenForReceiver(
          local_, shard.shard_path(),
          [&](const proto::BaseShard& b) {
            absl::StatusOr<uint64_t> there = snapshot::ManifestChecksumOf(
                fs_, PathOf(shard.job(), b.step(), shard.rank()));
            bases->push_back(b.step());
            return there.ok() && *there == b.manifest_xxh3();
          },
          &as_is));
  if (!as_is) bases->clear();
  return out;
}

absl::Status SharedTier::Copy(const proto::ShardRecord& shard) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(shard.job()));
  const std::string path = PathOf(shard.job(), shard.step(), shard.rank());
  const std::string partial = path + ".partial";
  // An increment over copies here, or the shard self-contained (its
  // unchanged chunks read from its bases) to stand alone.
  std::vector<uint64_t> bases;
  ASSIGN_OR_RETURN(snapshot::SelfContained view, Outgoing(shard, &bases));
  RETURN_IF_ERROR(AbortLeftUploads(path));
  RETURN_IF_ERROR(fs_->CreateDirs(io::DirName(path)));
  if (!bases.empty()) {
    // The pins first, durable: a copy never stands without them.
    for (uint64_t base : bases) {
      ASSIGN_OR_RETURN(
          std::unique_ptr<io::WritableFile> pin,
          fs_->NewWritableFile(
              io::JoinPath(io::DirName(path),
                           snapshot::PinName(base, shard.rank(), shard.step())),
              {}));
      RETURN_IF_ERROR(pin->Close());
    }
    RETURN_IF_ERROR(fs_->SyncDir(io::DirName(path)));
    // A collection elsewhere may have dropped a base before it saw the pin:
    // then the copy stands alone after all.
    for (uint64_t base : bases) {
      if (!snapshot::ManifestChecksumOf(fs_,
                                        PathOf(shard.job(), base, shard.rank()))
               .ok()) {
        ASSIGN_OR_RETURN(
            view, snapshot::OpenSelfContained(local_, shard.shard_path()));
        break;
      }
    }
  }
  const uint64_t size = view.size;
  if (store_.object_store()) {
    // Written over its key, where it appears whole once complete: what reads
    // the copy it replaces stands alone first.
    RETURN_IF_ERROR(DetachIfReplaced(shard, view, path));
    RETURN_IF_ERROR(snapshot::WriteSelfContained(fs_, view, path));
  } else {
    RETURN_IF_ERROR(snapshot::WriteSelfContained(fs_, view, partial));
    RETURN_IF_ERROR(DetachIfReplaced(shard, view, path));
    CKPT_KILL_POINT("shared.before_rename");
    RETURN_IF_ERROR(fs_->Rename(partial, path));
    RETURN_IF_ERROR(fs_->SyncDir(io::DirName(path)));
  }
  metrics_->Add("ckpt_shared_bytes_total", {{"job", shard.job()}},
                static_cast<double>(size));
  return absl::OkStatus();
}

absl::Status SharedTier::DetachIfReplaced(const proto::ShardRecord& shard,
                                          const snapshot::SelfContained& view,
                                          const std::string& path) {
  absl::StatusOr<uint64_t> old = snapshot::ManifestChecksumOf(fs_, path);
  if (!old.ok() || *old == snapshot::Checksum({reinterpret_cast<const uint8_t*>(
                                                   view.manifest_bytes.data()),
                                               view.manifest_bytes.size()})) {
    return absl::OkStatus();
  }
  return DetachDependents(shard.job(), shard.step(), shard.rank());
}

absl::Status SharedTier::AbortLeftUploads(const std::string& path) {
  if (!store_.object_store()) return absl::OkStatus();
  ASSIGN_OR_RETURN(io::s3::S3Uri uri, io::s3::ParseS3Uri(path));
  ASSIGN_OR_RETURN(std::vector<io::s3::MultipartUpload> left,
                   store_.client->ListMultipartUploads(uri.bucket, uri.prefix));
  for (const io::s3::MultipartUpload& u : left) {
    if (u.key != uri.prefix) continue;
    RETURN_IF_ERROR(
        store_.client->AbortMultipartUpload(uri.bucket, u.key, u.upload_id));
    CKPT_LOG_INFO("shared tier: aborted the upload of {} a crash left", path);
  }
  return absl::OkStatus();
}

absl::Status SharedTier::DetachDependents(const std::string& job, uint64_t step,
                                          uint32_t rank) {
  const std::string job_dir = io::JoinPath(options_.dir, job);
  ASSIGN_OR_RETURN(std::vector<std::string> names, fs_->ListDir(job_dir));
  // The rank's pins by the step of the copy that made them (later steps).
  std::map<uint64_t, std::vector<std::string>> pins;
  std::map<uint64_t, std::vector<uint64_t>> bases;
  for (const std::string& name : names) {
    uint64_t base = 0, of = 0;
    uint32_t r = 0;
    if (ParsePinName(name, &base, &r, &of) && r == rank && of > step) {
      pins[of].push_back(name);
      bases[of].push_back(base);
    }
  }
  // Rewriting a copy changes it, so the copies built on those go too (bases
  // are earlier steps: one pass in step order finds them).
  std::set<uint64_t> moving = {step};
  std::vector<uint64_t> dependents;
  for (const auto& [of, on] : bases) {
    if (std::any_of(on.begin(), on.end(),
                    [&](uint64_t b) { return moving.count(b) > 0; })) {
      moving.insert(of);
      dependents.push_back(of);
    }
  }
  // Newest first: each is read through its bases as they still are.
  for (auto it = dependents.rbegin(); it != dependents.rend(); ++it) {
    const std::string copy = PathOf(job, *it, rank);
    absl::StatusOr<snapshot::Detached> detached =
        snapshot::MakeSelfContained(fs_, copy, store_.object_store());
    if (!detached.ok() && !absl::IsNotFound(detached.status())) {
      return absl::Status(
          detached.status().code(),
          absl::StrCat(Describe(job, step, rank),
                       ": another save of it is not copied to the shared "
                       "tier: the copy of step ",
                       *it,
                       ", which stores chunks in it, could not be made "
                       "self-contained: ",
                       detached.status().message()));
    }
    for (const std::string& pin : pins[*it]) {
      (void)fs_->Unlink(io::JoinPath(job_dir, pin));
    }
    if (detached.ok()) {
      CKPT_LOG_INFO(
          "shared tier: {} made self-contained: step {}, which it stored "
          "chunks in, is copied again from another save",
          Describe(job, *it, rank), step);
    }
  }
  return fs_->SyncDir(job_dir);
}

absl::Status SharedTier::MarkCommitted(const proto::CommitRecord& commit) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(commit.job()));
  const std::string path =
      io::JoinPath(io::JoinPath(options_.dir, commit.job()),
                   snapshot::CommitMarkerName(commit.step()));
  std::string bytes;
  if (!commit.SerializeToString(&bytes)) {
    return absl::InternalError("a commit record does not serialize");
  }
  if (store_.object_store()) {
    // An object appears whole: no temporary name.
    ASSIGN_OR_RETURN(std::unique_ptr<io::WritableFile> out,
                     fs_->NewWritableFile(path, {}));
    RETURN_IF_ERROR(out->WriteBorrowed(
        0, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}));
    return out->Close();
  }
  RETURN_IF_ERROR(fs_->CreateDirs(io::DirName(path)));
  return io::ReplaceFileDurably(fs_, path, bytes);
}

absl::StatusOr<std::vector<proto::CommitRecord>> SharedTier::Markers(
    const std::string& job, absl::optional<uint64_t> step) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  const std::string job_dir = io::JoinPath(options_.dir, job);
  std::vector<std::string> names;
  if (step.has_value()) {
    names.push_back(snapshot::CommitMarkerName(*step));
  } else {
    absl::StatusOr<std::vector<std::string>> listed = fs_->ListDir(job_dir);
    if (absl::IsNotFound(listed.status())) {
      return std::vector<proto::CommitRecord>();
    }
    RETURN_IF_ERROR(listed.status());
    names = *std::move(listed);
  }
  std::vector<proto::CommitRecord> out;
  for (const std::string& name : names) {
    uint64_t at = 0;
    if (!ParseMarkerName(name, &at)) continue;
    absl::StatusOr<std::string> bytes =
        io::ReadFileToString(fs_, io::JoinPath(job_dir, name));
    if (absl::IsNotFound(bytes.status())) continue;
    RETURN_IF_ERROR(bytes.status());
    proto::CommitRecord& c = out.emplace_back();
    if (!c.ParseFromString(*bytes) || c.job() != job || c.step() != at) {
      return absl::DataLossError(
          absl::StrCat("the shared tier's commit marker ",
                       io::JoinPath(job_dir, name), " is damaged"));
    }
  }
  return out;
}

bool SharedTier::Has(const std::string& job, uint64_t step, uint32_t rank) {
  return snapshot::ValidateJobId(job).ok() &&
         fs_->Exists(PathOf(job, step, rank)).value_or(false);
}

absl::StatusOr<proto::ShardRecord> SharedTier::Find(const std::string& job,
                                                    uint64_t step,
                                                    uint32_t rank,
                                                    bool on_demand) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  const std::string path = PathOf(job, step, rank);
  absl::StatusOr<uint64_t> size = fs_->FileSize(path);
  if (!size.ok()) {
    return absl::NotFoundError(
        absl::StrCat("no copy of ", Describe(job, step, rank),
                     " in the shared tier ", options_.dir));
  }
  if (landed_ != nullptr) {
    ASSIGN_OR_RETURN(std::string local,
                     landed_->Land(fs_, path, job, step, rank,
                                   on_demand ? LandedCopies::How::kOnDemand
                                             : LandedCopies::How::kWhole));
    ASSIGN_OR_RETURN(uint64_t bytes, local_->FileSize(local));
    ASSIGN_OR_RETURN(
        proto::ShardRecord r,
        ReplicaStore::RecordOf(local_, {{job, step, rank}, local, bytes}));
    r.set_lands_on_demand(on_demand);
    return r;
  }
  return ReplicaStore::RecordOf(fs_, {{job, step, rank}, path, *size});
}

absl::Status SharedTier::LandRange(const std::string& local,
                                   const std::string& job, uint64_t step,
                                   uint32_t rank, uint64_t offset,
                                   uint64_t length) {
  if (landed_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shared tier ", options_.dir,
                     " is not an object store: its copies are read as they "
                     "are, nothing lands"));
  }
  return landed_->LandRange(local, job, step, rank, offset, length);
}

void SharedTier::CollectGarbage(
    const std::string& job, const std::vector<proto::CommitRecord>& commits) {
  std::vector<uint64_t> steps;
  for (const proto::CommitRecord& c : commits) {
    if (c.tier() == proto::TIER_SHARED) steps.push_back(c.step());
  }
  if (steps.empty()) return;
  const std::string job_dir = io::JoinPath(options_.dir, job);
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(job_dir);
  if (!names.ok()) return;
  const snapshot::SharedRetention plan =
      snapshot::PlanSharedRetention(*names, steps, options_.keep);
  // The kept steps' markers are there before anything older goes.
  const std::set<std::string> listed(names->begin(), names->end());
  for (const proto::CommitRecord& c : commits) {
    if (c.tier() != proto::TIER_SHARED || c.step() < plan.oldest_kept ||
        listed.count(snapshot::CommitMarkerName(c.step())) > 0) {
      continue;
    }
    if (absl::Status s = MarkCommitted(c); !s.ok()) {
      CKPT_LOG_WARN(
          "shared tier, job {} step {}: its commit marker: {}; "
          "nothing older is dropped",
          job, c.step(), s.ToString());
      return;
    }
  }
  // Markers of the steps dropped go before their copies. Partial files of a
  // copy cut short are left to the next copy of that shard (it truncates
  // them): another node may be writing one now.
  for (const std::string& name : plan.markers) {
    (void)fs_->Unlink(io::JoinPath(job_dir, name));
  }
  for (const std::string& name : plan.copies) {
    (void)fs_->Unlink(io::JoinPath(job_dir, name));
  }
  if (!plan.dropped_steps.empty()) {
    CKPT_LOG_INFO(
        "shared tier, job {}: copies of steps {} dropped; it keeps "
        "steps from {}",
        job, StepList(plan.dropped_steps), plan.oldest_kept);
  }
}

}  // namespace ckpt::daemon
