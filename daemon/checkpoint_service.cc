#include "daemon/checkpoint_service.h"

#include <algorithm>
#include <cinttypes>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "daemon/describe.h"
#include "daemon/records.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {
namespace {

// Checks the trainer's description of a slot before the daemon trusts any
// offset in it.
absl::Status ValidateItems(const std::vector<proto::StagedItem>& items,
                           uint64_t slot_bytes, const std::string& what) {
  std::set<std::string> names;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const proto::StagedItem& staged : items) {
    const proto::Item& item = staged.item();
    absl::Status name_ok = snapshot::ValidateItemName(item.name());
    if (!name_ok.ok())
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", name_ok.message()));
    if (!names.insert(item.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": item \"", item.name(), "\" appears twice"));
    }
    if (item.kind() == proto::ITEM_KIND_TENSOR) {
      absl::StatusOr<uint64_t> size = snapshot::ValidateTensorBox(item);
      if (!size.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": ", size.status().message()));
      }
      if (*size != item.raw_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": tensor \"", item.name(), "\" declares ",
                         item.raw_size(), " bytes but its box needs ", *size));
      }
    } else if (item.kind() != proto::ITEM_KIND_BYTES) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": item \"", item.name(), "\" has no kind"));
    }
    if (staged.slot_offset() > slot_bytes ||
        item.raw_size() > slot_bytes - staged.slot_offset()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": item \"", item.name(), "\" at slot offset ",
          staged.slot_offset(), " of ", item.raw_size(),
          " bytes does not fit the slot of ", slot_bytes, " bytes"));
    }
    if (item.chunks_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": item \"", item.name(), "\" must not carry chunks"));
    }
    if (item.raw_size() > 0)
      ranges.emplace_back(staged.slot_offset(), item.raw_size());
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].first + ranges[i - 1].second > ranges[i].first) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": items overlap at slot offset ", ranges[i].first));
    }
  }
  return absl::OkStatus();
}

}  // namespace

CheckpointService::CheckpointService(io::FileSystem* fs, ServiceOptions options)
    : fs_(fs), options_(std::move(options)) {}

std::string CheckpointService::ShardPath(const std::string& job, uint64_t step,
                                         uint32_t rank) const {
  char name[64];
  std::snprintf(name, sizeof name, "%020" PRIu64 "-%010u%s", step, rank,
                snapshot::kShardSuffix);
  return io::JoinPath(
      io::JoinPath(io::JoinPath(options_.data_dir, "shards"), job), name);
}

absl::StatusOr<std::unique_ptr<CheckpointService>> CheckpointService::Start(
    io::FileSystem* fs, ServiceOptions options) {
  if (options.data_dir.empty())
    return absl::InvalidArgumentError("data directory is empty");
  if (options.persist_threads < 1) {
    return absl::InvalidArgumentError("at least one persist thread is needed");
  }
  if (options.keep_disk_steps < 1 || options.keep_memory_steps < 1) {
    return absl::InvalidArgumentError(
        "retention must keep at least one step per tier");
  }
  std::unique_ptr<CheckpointService> service(
      new CheckpointService(fs, std::move(options)));
  service->DeclareMetrics();
  const ServiceOptions& o = service->options_;
  RETURN_IF_ERROR(fs->CreateDirs(io::JoinPath(o.data_dir, "shards")));
  ASSIGN_OR_RETURN(service->store_,
                   KvStore::Open(io::JoinPath(o.data_dir, "catalog")));
  service->catalog_ = std::make_unique<Catalog>(service->store_.get());
  service->coordinator_ =
      o.coordinator != nullptr
          ? o.coordinator
          : std::make_shared<EmbeddedCoordinator>(service->store_.get());
  ASSIGN_OR_RETURN(service->arena_,
                   StagingArena::Open(io::DefaultFileSystem(), o.staging));
  ASSIGN_OR_RETURN(
      service->recycler_,
      FileRecycler::Open(fs, io::JoinPath(o.data_dir, "recycle"),
                         static_cast<size_t>(std::max(0, o.recycle_files)),
                         [self = service.get()] {
                           // A shard being persisted.
                           absl::MutexLock lock(&self->mu_);
                           return !self->busy_.empty();
                         }));
  if (!o.replication.dir.empty()) {
    CheckpointService* self = service.get();
    ASSIGN_OR_RETURN(
        service->replicator_,
        Replicator::Start(
            fs, o.replication, service->coordinator_.get(), &service->metrics_,
            [self](const proto::ShardRecord& shard,
                   const std::vector<std::string>& nodes) {
              self->Replicated(shard, nodes);
            },
            [self](const std::vector<std::string>& lost) {
              self->PeersLost(lost);
            }));
  }
  if (!o.shared.dir.empty()) {
    CheckpointService* self = service.get();
    ASSIGN_OR_RETURN(service->shared_,
                     SharedTier::Start(fs, o.shared, &service->metrics_,
                                       [self](const proto::ShardRecord& shard) {
                                         self->VoteLater(shard,
                                                         proto::TIER_SHARED);
                                       }));
  }
  RETURN_IF_ERROR(service->Recover());
  for (int i = 0; i < o.persist_threads; ++i) {
    service->workers_.emplace_back([s = service.get()] { s->PersistLoop(); });
  }
  service->housekeeper_ =
      std::thread([s = service.get()] { s->Housekeeping(); });
  return service;
}

CheckpointService::~CheckpointService() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
  if (housekeeper_.joinable()) housekeeper_.join();
  replicator_.reset();  // its callback uses the catalog
  shared_.reset();
  recycler_.reset();  // its deletions ask whether a persist runs (mu_)
}

absl::Status CheckpointService::Recover() {
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards,
                   catalog_->ListShards());
  std::set<std::string> keep_slots, keep_files;
  std::vector<proto::ShardRecord> to_persist;
  for (proto::ShardRecord& r : shards) {
    if (r.state() == proto::SHARD_STAGING) {
      // Never staged completely: nothing was promised about it.
      CKPT_LOG_INFO("recovery: dropping incompletely staged {}",
                    Describe(r.job(), r.step(), r.rank()));
      RETURN_IF_ERROR(catalog_->DeleteShard(r.job(), r.step(), r.rank()));
      continue;
    }
    if (!r.slot_path().empty()) keep_slots.insert(r.slot_path());
    if (!r.shard_path().empty()) keep_files.insert(r.shard_path());
    if (r.state() == proto::SHARD_STAGED) to_persist.push_back(r);
    // Persisted but short of its peers when the daemon went down.
    if (replicator_ != nullptr && r.state() == proto::SHARD_PERSISTED &&
        r.replica_nodes_size() < options_.replication.replicas) {
      replicator_->Enqueue(
          r, {r.replica_nodes().begin(), r.replica_nodes().end()});
    }
    // Persisted, and due on the shared tier, but not copied there yet.
    if (shared_ != nullptr && r.state() == proto::SHARD_PERSISTED &&
        shared_->Wants(r.step()) &&
        !shared_->Has(r.job(), r.step(), r.rank())) {
      shared_->Enqueue(r);
    }
  }
  {
    std::set<std::string> jobs;
    for (const proto::ShardRecord& r : shards) jobs.insert(r.job());
    absl::MutexLock lock(&mu_);
    for (const std::string& job : jobs) {
      // Jobs with shards when ckptd starts: it went down under them.
      metrics_.Add("ckpt_failures_detected_total",
                   {{"job", job}, {"kind", "daemon_restart"}});
      JobHealth& health = health_[job];
      health.since = absl::Now();
      ++health.failures;
      // The newest shard's staging time stands for the last save before the
      // daemon went down.
      int64_t last_micros = 0;
      for (const proto::ShardRecord& r : shards) {
        if (r.job() == job) {
          last_micros = std::max(last_micros, r.staged_unix_micros());
        }
      }
      if (last_micros > 0)
        health.down_since = absl::FromUnixMicros(last_micros);
    }
  }
  ASSIGN_OR_RETURN(std::vector<SlotInfo> adopted,
                   arena_->Recover([&](const SlotInfo& s) {
                     return keep_slots.count(s.path) > 0;
                   }));
  std::set<std::string> present;
  for (const SlotInfo& s : adopted) present.insert(s.path);
  for (proto::ShardRecord& r : to_persist) {
    if (present.count(r.slot_path()) == 0) {
      r.set_state(proto::SHARD_FAILED);
      r.set_error(absl::StrCat("staging slot ", r.slot_path(),
                               " was lost (node reboot?)"));
      r.clear_slot_path();
      RETURN_IF_ERROR(catalog_->PutShard(r));
      continue;
    }
    CKPT_LOG_INFO("recovery: adopting staged {}",
                  Describe(r.job(), r.step(), r.rank()));
    metrics_.Add("ckpt_recovered_shards_total", {{"job", r.job()}});
    Enqueue({r.job(), r.step(), r.rank()});
  }
  // What a previous run left for garbage collection (it went down before
  // collecting, or in the middle) goes now, before the first save needs the
  // room: with nothing to persist, nothing else would start a collection.
  {
    absl::MutexLock lock(&mu_);
    for (const proto::ShardRecord& r : shards) gc_wanted_.insert(r.job());
  }
  // Shard files the catalog does not reference: temporaries of an interrupted
  // persist, or files whose garbage collection was interrupted after the
  // catalog forgot them.
  std::string shards_dir = io::JoinPath(options_.data_dir, "shards");
  ASSIGN_OR_RETURN(std::vector<std::string> jobs, fs_->ListDir(shards_dir));
  for (const std::string& job : jobs) {
    absl::StatusOr<std::vector<std::string>> names =
        fs_->ListDir(io::JoinPath(shards_dir, job));
    if (!names.ok()) continue;
    for (const std::string& name : *names) {
      std::string path = io::JoinPath(io::JoinPath(shards_dir, job), name);
      if (keep_files.count(path) == 0) {
        CKPT_LOG_INFO("recovery: removing unreferenced {}", path);
        (void)fs_->Unlink(path);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SlotInfo> CheckpointService::BeginStage(
    const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
    uint64_t bytes, absl::Time deadline) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  if (world_size == 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(job, step, rank), ": rank is outside world size ",
                     world_size));
  }
  if (rank == 0) SawSave(job, step);
  activity_.Saved(job);
  // One BeginStage per shard at a time: the record is read, a predecessor
  // superseded and the slot allocated (which may wait for memory) before the
  // new record is written, and a call still running for a trainer that died
  // meanwhile must not write its record over the one a restarted trainer's
  // save made in between (a committed step's shard would be lost).
  const SlotId key{job, step, rank};
  {
    absl::MutexLock lock(&begin_mu_);
    auto free = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(begin_mu_) {
      return beginning_.count(key) == 0;
    };
    begin_mu_.Await(absl::Condition(&free));
    beginning_.insert(key);
  }
  absl::Cleanup done = [this, &key] {
    absl::MutexLock lock(&begin_mu_);
    beginning_.erase(key);
  };
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> existing,
                   catalog_->GetShard(job, step, rank));
  if (existing.has_value()) {
    if (existing->state() == proto::SHARD_STAGING) {
      // A trainer that died while staging and saves the same step again
      // starts over.
      RETURN_IF_ERROR(AbortStage(job, step, rank));
    } else {
      RETURN_IF_ERROR(Supersede(*existing));
    }
  }
  const absl::Time begun = absl::Now();
  if (!arena_->Fits(bytes)) {
    // Slots retention no longer keeps make room: collect now rather than
    // after the next persist, which may be waiting for this very slot. Then
    // copies safe elsewhere give way, other jobs' idle ones first; what is
    // still short is waited for (a persist in flight frees more, see
    // PersistLoop).
    absl::StatusOr<RetentionPlan> collected = CollectGarbage(
        job, {options_.keep_disk_steps, options_.keep_memory_steps});
    if (!collected.ok()) {
      CKPT_LOG_WARN("gc of job {}: {}", job, collected.status().ToString());
    }
    RelieveMemoryPressure(job, arena_->ShortfallFor(bytes));
  }
  absl::StatusOr<SlotInfo> allocated =
      arena_->Allocate({job, step, rank}, bytes, deadline);
  if (!allocated.ok()) {
    if (allocated.status().code() != absl::StatusCode::kResourceExhausted)
      return allocated.status();
    metrics_.Add("ckpt_steps_skipped_total", {{"job", job}});
    return absl::ResourceExhaustedError(absl::StrCat(
        allocated.status().message(), "; ", DescribeMemoryHolders()));
  }
  const SlotInfo& slot = *allocated;
  // The rank's next save of this size finds its slot ready.
  arena_->PrepareAhead(slot.bytes);
  {
    absl::MutexLock lock(&mu_);
    begun_[{job, step, rank}] = begun;
    first_begun_.emplace(std::make_pair(job, step), begun);  // keeps the first
  }
  proto::JobRecord job_record;
  job_record.set_job(job);
  job_record.set_world_size(world_size);
  job_record.set_created_unix_micros(NowMicros());
  proto::ShardRecord record;
  record.set_job(job);
  record.set_step(step);
  record.set_rank(rank);
  record.set_world_size(world_size);
  record.set_state(proto::SHARD_STAGING);
  record.set_slot_path(slot.path);
  record.set_slot_bytes(slot.bytes);
  // Not synced: a STAGING record that a crash loses leaves a slot file that
  // recovery deletes, which is what it would do with the record too. The STAGED
  // record is synced.
  absl::Status s = catalog_->PutJob(job_record, /*sync=*/false);
  if (s.ok()) s = catalog_->PutShard(record, /*sync=*/false);
  if (!s.ok()) {
    (void)arena_->Release(slot.id);
    return s;
  }
  return slot;
}

absl::Status CheckpointService::Supersede(const proto::ShardRecord& old) {
  const SlotId id{old.job(), old.step(), old.rank()};
  const std::string what = Describe(id.job, id.step, id.rank);
  bool was_queued = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const SlotId& q) {
      return q.job == id.job && q.step == id.step && q.rank == id.rank;
    });
    if (it != queue_.end()) {
      queue_.erase(it);
      was_queued = true;
    }
    auto persisted = [this, &id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto b = busy_.find({id.job, id.rank});
      return b == busy_.end() || b->second != id.step;
    };
    mu_.Await(absl::Condition(&persisted));
  }
  // The coordinator refuses atomically if the step is committed anywhere.
  absl::Status withdrawn = coordinator_->WithdrawVote(id.job, id.step, id.rank);
  if (!withdrawn.ok()) {
    // A committed step stays as it is, persist included.
    if (was_queued) Enqueue(id);
    return absl::Status(withdrawn.code(),
                        absl::StrCat(what, ": ", withdrawn.message()));
  }
  // Garbage collection rewrites records from its own snapshot of the catalog:
  // keep it from resurrecting the one deleted here.
  absl::MutexLock gc(&gc_mu_);
  // Re-read: the persist that was in flight may have changed the record.
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> current,
                   catalog_->GetShard(id.job, id.step, id.rank));
  if (!current.has_value()) return absl::OkStatus();
  CKPT_LOG_INFO("{}: replaced by a new save of the same step (was {})", what,
                proto::ShardState_Name(current->state()));
  // The catalog forgets first: a crash in between leaves files that recovery
  // deletes, never a record naming a deleted file.
  RETURN_IF_ERROR(catalog_->DeleteShard(id.job, id.step, id.rank));
  if (!current->shard_path().empty()) (void)fs_->Unlink(current->shard_path());
  if (!current->slot_path().empty()) (void)arena_->Release(id);
  return absl::OkStatus();
}

absl::Status CheckpointService::AbortStage(const std::string& job,
                                           uint64_t step, uint32_t rank) {
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> record,
                   catalog_->GetShard(job, step, rank));
  if (!record.has_value() || record->state() != proto::SHARD_STAGING) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(job, step, rank), " is not being staged"));
  }
  RETURN_IF_ERROR(catalog_->DeleteShard(job, step, rank));
  absl::Status s = arena_->Release({job, step, rank});
  return s.code() == absl::StatusCode::kNotFound ? absl::OkStatus() : s;
}

absl::Status CheckpointService::StageComplete(
    const std::string& job, uint64_t step, uint32_t rank,
    const std::vector<proto::StagedItem>& items) {
  const std::string what = Describe(job, step, rank);
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> record,
                   catalog_->GetShard(job, step, rank));
  if (!record.has_value() || record->state() != proto::SHARD_STAGING) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " has no slot being staged"));
  }
  RETURN_IF_ERROR(ValidateItems(items, record->slot_bytes(), what));
  record->set_state(proto::SHARD_STAGED);
  record->set_staged_unix_micros(NowMicros());
  for (const proto::StagedItem& item : items) *record->add_items() = item;
  CKPT_KILL_POINT("service.before_staged_record");
  RETURN_IF_ERROR(catalog_->PutShard(*record));
  CKPT_KILL_POINT("service.after_staged_record");
  {
    absl::MutexLock lock(&mu_);
    auto b = begun_.find({job, step, rank});
    if (b != begun_.end()) {
      const double seconds = absl::ToDoubleSeconds(absl::Now() - b->second);
      metrics_.Observe("ckpt_staging_seconds", {{"job", job}}, seconds);
      JobHealth& health = health_[job];
      health.staging_seconds += seconds;
      ++health.stagings;
      begun_.erase(b);
    }
  }
  // A trainer stages one step at a time, in order: a staging of this rank
  // begun before this one and never completed was abandoned (its trainer
  // died, or gave up on the call). Its slot goes back to the budget now
  // rather than at the next restart.
  std::vector<uint64_t> abandoned;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = begun_.lower_bound({job, 0, 0});
         it != begun_.end() && std::get<0>(it->first) == job &&
         std::get<1>(it->first) < step;) {
      if (std::get<2>(it->first) == rank) {
        abandoned.push_back(std::get<1>(it->first));
        it = begun_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (uint64_t old_step : abandoned) {
    if (AbortStage(job, old_step, rank).ok()) {
      CKPT_LOG_INFO("{}: abandoned while staging; its slot is freed",
                    Describe(job, old_step, rank));
    }
  }
  uint64_t staged_bytes = 0;
  for (const proto::StagedItem& item : items)
    staged_bytes += item.item().raw_size();
  metrics_.Add("ckpt_staged_bytes_total", {{"job", job}},
               static_cast<double>(staged_bytes));
  absl::StatusOr<std::vector<proto::Tier>> committed = coordinator_->Vote(
      job, step, rank, record->world_size(), {proto::TIER_MEMORY});
  if (!committed.ok()) {
    // The shard is staged and will persist; only the memory-tier vote is
    // missing.
    CKPT_LOG_WARN("{}: memory-tier vote failed: {}", what,
                  committed.status().ToString());
  } else {
    Committed(job, step, *committed);
    // An older step's slot may leave the memory tier now.
    if (std::find(committed->begin(), committed->end(), proto::TIER_MEMORY) !=
        committed->end())
      RequestGc(job);
  }
  Enqueue({job, step, rank});
  return absl::OkStatus();
}

void CheckpointService::Enqueue(const SlotId& id) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(id);
  ++generation_;
}

void CheckpointService::Committed(const std::string& job, uint64_t step,
                                  const std::vector<proto::Tier>& tiers) {
  if (tiers.empty()) return;
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  auto first = first_begun_.find({job, step});
  for (proto::Tier tier : tiers) {
    const Labels labels = {{"job", job}, {"tier", TierName(tier)}};
    auto [last, fresh] = last_commit_.try_emplace({job, tier}, step, now);
    if (!fresh) {
      if (last->second.first >= step) continue;  // latest never goes back
      last->second = {step, now};
    }
    metrics_.Set("ckpt_last_committed_step", labels, static_cast<double>(step));
    if (first != first_begun_.end()) {
      metrics_.Observe("ckpt_commit_latency_seconds", labels,
                       absl::ToDoubleSeconds(now - first->second));
    }
  }
  // The first BeginStage of older steps is not needed once a step is on disk.
  if (std::find(tiers.begin(), tiers.end(), proto::TIER_LOCAL_DISK) !=
      tiers.end()) {
    first_begun_.erase(first_begun_.lower_bound({job, 0}),
                       first_begun_.upper_bound({job, step}));
  }
}

absl::Status CheckpointService::ReportRestore(
    const proto::ReportRestoreRequest& report) {
  const std::string& job = report.shard().job();
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  for (const auto& [source, bytes] :
       {std::make_pair(TierName(proto::TIER_MEMORY), report.memory_bytes()),
        std::make_pair(TierName(proto::TIER_LOCAL_DISK),
                       report.local_disk_bytes()),
        std::make_pair(std::string("peer_stream"), report.peer_bytes())}) {
    if (bytes == 0) continue;
    const Labels labels = {{"job", job}, {"source", source}};
    metrics_.Add("ckpt_restores_total", labels);
    metrics_.Add("ckpt_restored_bytes_total", labels,
                 static_cast<double>(bytes));
  }
  metrics_.Add("ckpt_checksum_mismatches_total", {{"job", job}},
               report.checksum_mismatches());
  metrics_.Add("ckpt_restore_fallbacks_total", {{"job", job}},
               report.fallbacks());
  if (!report.resume()) return absl::OkStatus();
  return WithdrawNewer(job, report.shard().rank(), report.shard().step());
}

absl::Status CheckpointService::WithdrawNewer(const std::string& job,
                                              uint32_t rank, uint64_t step) {
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards,
                   catalog_->ListShards(job));
  for (const proto::ShardRecord& shard : shards) {
    if (shard.rank() != rank || shard.step() <= step) continue;
    const std::string what = Describe(job, shard.step(), rank);
    absl::Status withdrawn = shard.state() == proto::SHARD_STAGING
                                 ? AbortStage(job, shard.step(), rank)
                                 : Supersede(shard);
    if (withdrawn.ok()) {
      CKPT_LOG_INFO("{}: withdrawn, rank {} resumed from step {}", what, rank,
                    step);
      metrics_.Add("ckpt_shards_withdrawn_total", {{"job", job}});
    } else if (withdrawn.code() == absl::StatusCode::kFailedPrecondition ||
               withdrawn.code() == absl::StatusCode::kAlreadyExists) {
      // Committed (or gone) meanwhile: a committed step is never taken back;
      // the trainer restored an older step on purpose.
      CKPT_LOG_INFO("{}: kept although rank {} resumed from step {}: {}", what,
                    rank, step, std::string(withdrawn.message()));
    } else {
      return absl::Status(withdrawn.code(),
                          absl::StrCat("withdrawing ", what, " (rank ", rank,
                                       " resumed from step ", step,
                                       "): ", withdrawn.message()));
    }
  }
  return absl::OkStatus();
}

void CheckpointService::SawSave(const std::string& job, uint64_t step) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  JobHealth& h = health_[job];
  if (h.since == absl::InfinitePast()) h.since = now;
  if (h.last_save != absl::InfinitePast()) {
    if (step <= h.last_step) {
      // Rank 0 saves a step it saved before: the job restarted from an
      // earlier checkpoint. Its recovery took from its last save before the
      // failure to this one.
      const Labels kind = {{"job", job}, {"kind", "job_restart"}};
      metrics_.Add("ckpt_failures_detected_total", kind);
      metrics_.Add("ckpt_recoveries_total", kind);
      metrics_.Observe("ckpt_recovery_seconds", kind,
                       absl::ToDoubleSeconds(now - h.last_save));
      ++h.failures;
    } else {
      const double dt = absl::ToDoubleSeconds(now - h.last_save);
      h.interval = h.intervals == 0 ? dt : 0.8 * h.interval + 0.2 * dt;
      ++h.intervals;
    }
  }
  if (h.down_since != absl::InfinitePast()) {
    const Labels kind = {{"job", job}, {"kind", "daemon_restart"}};
    metrics_.Add("ckpt_recoveries_total", kind);
    metrics_.Observe("ckpt_recovery_seconds", kind,
                     absl::ToDoubleSeconds(now - h.down_since));
    h.down_since = absl::InfinitePast();
  }
  h.last_save = now;
  h.last_step = step;
}

void CheckpointService::RequestGc(const std::string& job) {
  absl::MutexLock lock(&mu_);
  gc_wanted_.insert(job);
}

absl::StatusOr<proto::CommitRecord> CheckpointService::WaitCommitted(
    const std::string& job, uint64_t step, proto::Tier tier,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // A waiter must not depend on other saves to get the votes refused while
    // this node was fenced made again.
    RevoteIfRejoined();
    uint64_t seen;
    {
      absl::MutexLock lock(&mu_);
      seen = generation_;
    }
    ASSIGN_OR_RETURN(absl::optional<proto::CommitRecord> commit,
                     coordinator_->GetCommit(job, step, tier));
    if (commit.has_value()) return *commit;
    ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards,
                     catalog_->ListShards(job));
    for (const proto::ShardRecord& r : shards) {
      if (r.step() == step && r.state() == proto::SHARD_FAILED &&
          tier == proto::TIER_LOCAL_DISK) {
        return absl::Status(absl::StatusCode::kAborted,
                            absl::StrCat(Describe(job, step, r.rank()),
                                         " failed to persist: ", r.error()));
      }
    }
    absl::MutexLock lock(&mu_);
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return generation_ != seen;
    };
    // Another node's vote may commit the step (etcd): look again every
    // 100 ms even when nothing changed here.
    if (!mu_.AwaitWithDeadline(
            absl::Condition(&changed),
            std::min(deadline, absl::Now() + absl::Milliseconds(100))) &&
        absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "job ", job, " step ", step, " is not committed at tier ",
          TierName(tier), " after ", absl::FormatDuration(timeout)));
    }
  }
}

absl::StatusOr<absl::optional<uint64_t>> CheckpointService::LatestCommitted(
    const std::string& job, proto::Tier tier) {
  return coordinator_->LatestCommitted(job, tier);
}

absl::StatusOr<std::vector<proto::CommitRecord>> CheckpointService::ListCommits(
    const std::string& job) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  return coordinator_->ListCommits(job);
}

absl::StatusOr<proto::ShardRecord> CheckpointService::GetShard(
    const std::string& job, uint64_t step, uint32_t rank) {
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> r,
                   catalog_->GetShard(job, step, rank));
  // Whole here: staged (its slot), persisted (its file), or failed to persist
  // with its slot left.
  const bool whole =
      r.has_value() &&
      (r->state() == proto::SHARD_STAGED ||
       r->state() == proto::SHARD_PERSISTED ||
       (r->state() == proto::SHARD_FAILED && !r->slot_path().empty()));
  // A shard being staged here is a new save of the step (one not yet
  // committed when it began): a committed copy of the step, if peers or the
  // shared tier hold one, is what a restore wants; else the caller learns
  // that it is being staged.
  if (whole) return *r;
  absl::Status elsewhere = absl::NotFoundError(
      absl::StrCat("no shard for ", Describe(job, step, rank)));
  if (replicator_ != nullptr) {
    absl::StatusOr<proto::ShardRecord> fetched =
        replicator_->Fetch(job, step, rank);
    if (fetched.ok()) return fetched;
    elsewhere = fetched.status();
  }
  if (shared_ != nullptr) {
    absl::StatusOr<proto::ShardRecord> copy = shared_->Find(job, step, rank);
    if (copy.ok()) return copy;
    elsewhere = absl::Status(
        elsewhere.code(),
        absl::StrCat(elsewhere.message(), "; ", copy.status().message()));
  }
  if (!r.has_value()) return elsewhere;
  if (replicator_ != nullptr || shared_ != nullptr) {
    CKPT_LOG_WARN("{}: no copy elsewhere either: {}", Describe(job, step, rank),
                  elsewhere.ToString());
  }
  if (!r.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("no shard for ", Describe(job, step, rank)));
  }
  return *r;
}

void CheckpointService::WaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && busy_.empty() && gc_running_ == 0 &&
           gc_wanted_.empty();
  };
  mu_.Await(absl::Condition(&idle));
}

}  // namespace ckpt::daemon
