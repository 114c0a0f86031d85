#include "daemon/service/checkpoint_service.h"

#include <algorithm>
#include <cinttypes>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/describe.h"
#include "daemon/common/records.h"
#include "daemon/health/replica_check.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/secure_random.h"
#include "io/status_macros.h"
#include "snapshot/format.h"
#include "snapshot/manifest_seal.h"
#include "snapshot/names.h"

namespace ckpt::daemon {
namespace {

// Checks the trainer's description of a slot before the daemon trusts any
// offset in it.
absl::Status ValidateItems(const std::vector<proto::StagedItem>& items,
                           uint64_t slot_bytes, uint32_t chunk_size,
                           const std::string& what) {
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
    // Hashes the client took of its slot: one per chunk of the size the
    // daemon gave it (BeginStageResponse.chunk_size), or none.
    if (staged.chunk_xxh3_size() != 0) {
      if (staged.chunk_size() != chunk_size ||
          static_cast<uint64_t>(staged.chunk_xxh3_size()) !=
              snapshot::ChunkCount(item.raw_size(), chunk_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": item \"", item.name(), "\" carries ",
                         staged.chunk_xxh3_size(), " chunk hashes of ",
                         staged.chunk_size(), "-byte chunks; ", item.raw_size(),
                         " bytes in ", chunk_size, "-byte chunks need ",
                         snapshot::ChunkCount(item.raw_size(), chunk_size)));
      }
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
  if (options.data_dir.empty()) {
    return absl::InvalidArgumentError("data directory is empty");
  }
  if (options.persist_threads < 1) {
    return absl::InvalidArgumentError("at least one persist thread is needed");
  }
  if (options.keep_disk_steps < 1 || options.keep_memory_steps < 1) {
    return absl::InvalidArgumentError(
        "retention must keep at least one step per tier");
  }
  if (options.parity.k > 0 && options.replication.dir.empty()) {
    return absl::InvalidArgumentError(
        "--peer-redundancy needs the peer tier (--peer-address)");
  }
  std::unique_ptr<CheckpointService> service(
      new CheckpointService(fs, std::move(options)));
  service->DeclareMetrics();
  RETURN_IF_ERROR(service->OpenLocalState());
  RETURN_IF_ERROR(service->StartPeerTier());
  RETURN_IF_ERROR(service->StartParityTier());
  RETURN_IF_ERROR(service->StartSharedTier());
  RETURN_IF_ERROR(service->StartPublisher());
  RETURN_IF_ERROR(service->Recover());
  for (int i = 0; i < service->options_.persist_threads; ++i) {
    service->workers_.emplace_back([s = service.get()] { s->PersistLoop(); });
  }
  service->housekeeper_ =
      std::thread([s = service.get()] { s->Housekeeping(); });
  // Its own thread: a housekeeping round held up by a collection must not
  // look like ckptd stopped (HangWatch restarts its clocks then).
  service->hang_watcher_ = std::thread([s = service.get()] {
    while (!s->queue_.WaitForStop(absl::Milliseconds(250)))
      s->NoteHungTrainers();
  });
  service->node_watch_ = std::make_unique<NodeWatch>(
      service->coordinator_.get(), service->options_.node_id,
      &service->failures_, [s = service.get()] { return s->ServedJobs(); });
  return service;
}

absl::Status CheckpointService::OpenLocalState() {
  const ServiceOptions& o = options_;
  RETURN_IF_ERROR(fs_->CreateDirs(io::JoinPath(o.data_dir, "shards")));
  ASSIGN_OR_RETURN(store_, KvStore::Open(io::JoinPath(o.data_dir, "catalog")));
  catalog_ = std::make_unique<Catalog>(store_.get());
  coordinator_ = o.coordinator != nullptr
                     ? o.coordinator
                     : std::make_shared<EmbeddedCoordinator>(store_.get());
  RETURN_IF_ERROR(InstallAgreedClusterKey());
  audit_ = std::make_unique<ReplicaAudit>(
      coordinator_.get(), &metrics_, o.node_id,
      [this](const proto::ReplicaCheck& check, bool kept_here) {
        stragglers_.Saw(check);
        if (kept_here && check.suspect()) {
          failures_.Failed(check.job(), "sdc_suspected",
                           absl::StrCat("step ", check.step(), ": ",
                                        DescribeMismatches(check)),
                           /*incident=*/false, absl::Now());
        }
      });
  ASSIGN_OR_RETURN(arena_,
                   StagingArena::Open(io::DefaultFileSystem(), o.staging));
  ASSIGN_OR_RETURN(
      recycler_,
      FileRecycler::Open(fs_, io::JoinPath(o.data_dir, "recycle"),
                         static_cast<size_t>(std::max(0, o.recycle_files)),
                         [this] { return queue_.Persisting(); }));
  return absl::OkStatus();
}

absl::Status CheckpointService::StartPeerTier() {
  if (options_.replication.dir.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(
      replicator_,
      Replicator::Start(
          fs_, options_.replication, coordinator_.get(), &metrics_,
          [this](const proto::ShardRecord& shard,
                 const std::vector<std::string>& nodes) {
            Replicated(shard, nodes);
          },
          [this](const std::vector<std::string>& lost) { PeersLost(lost); },
          [this](const std::string& job, const std::string& node,
                 const absl::Status& status) {
            PeerReached(job, node, status);
          }));
  return absl::OkStatus();
}

absl::Status CheckpointService::StartParityTier() {
  if (options_.parity.k == 0) return absl::OkStatus();
  ParityOptions parity = options_.parity;
  if (parity.dir.empty()) {
    parity.dir = io::JoinPath(options_.replication.dir, "parity");
  }
  Replicator* replicator = replicator_.get();
  parity.send_rate = replicator->send_rate();
  ASSIGN_OR_RETURN(
      parity_,
      ParityTier::Start(
          fs_, std::move(parity), coordinator_.get(), &metrics_,
          [replicator](const std::string& address) {
            return replicator->ChannelTo(address);
          },
          [this](const std::string& job, uint64_t step, uint32_t rank) {
            return LocalShardFile(job, step, rank);
          },
          [this](const proto::ShardRecord& shard) { ParityProtected(shard); }));
  // Fetches fall back to a rebuild from the group; repairs of lost data
  // blocks are fetches kept as stand-ins.
  ParityTier* tier = parity_.get();
  replicator->SetRebuilder([tier](const std::string& job, uint64_t step,
                                  uint32_t rank,
                                  const Replicator::RebuildSink& sink) {
    return tier->Rebuild(job, step, rank, sink);
  });
  tier->SetRepair(
      [replicator](const std::string& job, uint64_t step, uint32_t rank) {
        RETURN_IF_ERROR(replicator->Fetch(job, step, rank).status());
        replicator->KeepAsStandIn(job, step, rank);
        return absl::OkStatus();
      });
  return absl::OkStatus();
}

absl::Status CheckpointService::StartPublisher() {
  if (options_.publish.dir.empty()) return absl::OkStatus();
  PublishOptions publish = options_.publish;
  if (publish.node_id.empty()) publish.node_id = options_.node_id;
  // A step of a job on several nodes: the other nodes' ranks are fetched.
  Publisher::FetchShardFile fetch;
  if (replicator_ != nullptr) {
    Replicator* replicator = replicator_.get();
    fetch = [replicator](const std::string& job, uint64_t step,
                         uint32_t rank) -> absl::StatusOr<std::string> {
      ASSIGN_OR_RETURN(proto::ShardRecord r,
                       replicator->Fetch(job, step, rank));
      return r.shard_path();
    };
  }
  // The versions live in memory (tmpfs) beside the staging slots.
  ASSIGN_OR_RETURN(publisher_, Publisher::Open(
                                   io::DefaultFileSystem(), std::move(publish),
                                   coordinator_.get(), &metrics_,
                                   [this](const std::string& job, uint64_t step,
                                          uint32_t rank) {
                                     return LocalShardFile(job, step, rank);
                                   },
                                   std::move(fetch)));
  if (replicator_ != nullptr) {
    SubscriptionOptions subscription = options_.subscription;
    if (subscription.node_id.empty()) subscription.node_id = options_.node_id;
    Replicator* replicator = replicator_.get();
    subscriptions_ = std::make_unique<Subscriptions>(
        io::DefaultFileSystem(), publisher_.get(), coordinator_.get(),
        &metrics_,
        [replicator](const std::string& address) {
          return replicator->ChannelTo(address);
        },
        std::move(subscription));
  }
  for (const std::string& topic : options_.subscribe) {
    RETURN_IF_ERROR(Subscribe(topic).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> CheckpointService::Subscribe(const std::string& topic) {
  if (publisher_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot subscribe to topic ", topic,
                     ": publication is off on this node (--publish-dir none)"));
  }
  if (subscriptions_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot subscribe to topic ", topic,
        ": a subscriber fetches versions from its peers, and this node has "
        "no peer tier (start ckptd with --peer-address)"));
  }
  return subscriptions_->Add(topic);
}

absl::Status CheckpointService::StartSharedTier() {
  if (options_.shared.dir.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(shared_,
                   SharedTier::Start(fs_, options_.shared, &metrics_,
                                     [this](const proto::ShardRecord& shard) {
                                       VoteLater(shard, proto::TIER_SHARED);
                                     }));
  return absl::OkStatus();
}

absl::Status CheckpointService::InstallAgreedClusterKey() {
  if (!options_.agree_cluster_key) return absl::OkStatus();
  absl::StatusOr<proto::ClusterKeyRecord> agreed =
      coordinator_->AgreeClusterKey(
          io::SecureRandomBytes(snapshot::SealKeys::kMinKeyBytes),
          options_.node_id);
  if (!agreed.ok()) {
    return absl::Status(agreed.status().code(),
                        absl::StrCat("agreeing on the cluster key: ",
                                     agreed.status().message()));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const snapshot::SealKeys> keys,
                   SealKeysOf(*agreed));
  CKPT_LOG_INFO(
      "ckptd: manifests sealed with cluster key {} (the cluster's own, made "
      "by {} at {}{})",
      keys->current_id(), agreed->created_by(),
      absl::FormatTime(absl::FromUnixMicros(agreed->created_unix_micros())),
      agreed->unsealed_through().empty()
          ? ""
          : absl::StrCat("; steps of ", agreed->unsealed_through().size(),
                         " jobs saved before it stay readable "
                         "unsealed"));
  snapshot::InstallSealKeys(std::move(keys));
  return absl::OkStatus();
}

CheckpointService::~CheckpointService() {
  node_watch_.reset();
  queue_.Stop();
  for (std::thread& t : workers_) t.join();
  if (housekeeper_.joinable()) housekeeper_.join();
  if (hang_watcher_.joinable()) hang_watcher_.join();
  subscriptions_.reset();  // fetches through the replicator's channels
  // The parity tier's callbacks use the replicator and the catalog.
  if (replicator_ != nullptr) replicator_->SetRebuilder(nullptr);
  if (parity_ != nullptr) parity_->SetRepair(nullptr);
  parity_.reset();
  replicator_.reset();  // its callback uses the catalog
  shared_.reset();
  recycler_.reset();  // its deletions ask whether a persist runs
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
  if (rank == 0) health_.SawSave(job, step, absl::Now());
  activity_.Saved(job);
  hangs_.Saved(job, rank, step, absl::Now());  // one that tries to save lives
  absl::Cleanup saved = [&] { hangs_.Done(job, rank, absl::Now()); };
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
  health_.StagingBegun({job, step, rank}, begun);
  failures_.Saved(job, step, rank, begun);
  goodput_.StagingBegun(job, step, rank, begun);
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
  const bool was_queued = queue_.Withdraw(id);
  // A persist in flight may build on this shard (pinned while its step was
  // committed on disk, before another node's collection forgot that): what
  // it writes must be detached below too. No new pin comes: the step has no
  // commit record now, or the withdrawal below fails.
  RETURN_IF_ERROR(
      bases_.WaitUnpinned(id.job, id.rank, id.step, absl::Minutes(1)));
  // Garbage collection rewrites records from its own snapshot of the catalog:
  // keep it from resurrecting the one deleted here. And a replication that
  // completes meanwhile must not vote again for the shard withdrawn here
  // (Replicated votes under gc_mu_ too): its step could then be committed at
  // the peer tier without this rank's copy.
  absl::MutexLock gc(&gc_mu_);
  // The coordinator refuses atomically if the step is committed anywhere.
  absl::Status withdrawn = coordinator_->WithdrawVote(id.job, id.step, id.rank);
  if (!withdrawn.ok()) {
    // A committed step stays as it is, persist included.
    if (was_queued) Enqueue(id);
    return absl::Status(withdrawn.code(),
                        absl::StrCat(what, ": ", withdrawn.message()));
  }
  // Re-read: the persist that was in flight may have changed the record.
  ASSIGN_OR_RETURN(absl::optional<proto::ShardRecord> current,
                   catalog_->GetShard(id.job, id.step, id.rank));
  if (!current.has_value()) return absl::OkStatus();
  CKPT_LOG_INFO("{}: replaced by a new save of the same step (was {})", what,
                proto::ShardState_Name(current->state()));
  // The new save takes this file's name: shards that store chunks in it are
  // made self-contained first, or the new save fails (the vote is withdrawn,
  // the file and the record stay).
  RETURN_IF_ERROR(DetachDependents(*current));
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
  RETURN_IF_ERROR(ValidateItems(items, record->slot_bytes(),
                                options_.writer.chunk_size, what));
  record->set_state(proto::SHARD_STAGED);
  record->set_staged_unix_micros(NowMicros());
  for (const proto::StagedItem& item : items) *record->add_items() = item;
  CKPT_KILL_POINT("service.before_staged_record");
  RETURN_IF_ERROR(catalog_->PutShard(*record));
  CKPT_KILL_POINT("service.after_staged_record");
  audit_->PostStaged(*record);
  // A trainer stages one step at a time, in order: a staging of this rank
  // begun before this one and never completed was abandoned (its trainer
  // died, or gave up on the call). Its slot goes back to the budget now
  // rather than at the next restart.
  const absl::Time staged = absl::Now();
  goodput_.Staged(job, rank, staged);
  const std::vector<uint64_t> abandoned =
      health_.Staged({job, step, rank}, staged);
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
      queue_.RequestGc(job);
  }
  Enqueue({job, step, rank});
  return absl::OkStatus();
}

void CheckpointService::Enqueue(const SlotId& id) {
  for (const SlotId& old : queue_.Add(id, options_.persist_newest)) {
    SkipPersist(old, id.step);
  }
  changes_.Bump();
}

void CheckpointService::SkipPersist(const SlotId& id, uint64_t newer) {
  absl::StatusOr<absl::optional<proto::ShardRecord>> r =
      catalog_->GetShard(id.job, id.step, id.rank);
  if (!r.ok() || !r->has_value() || (*r)->state() != proto::SHARD_STAGED) {
    return;  // withdrawn meanwhile
  }
  (*r)->set_persist_skipped(true);
  if (absl::Status s = catalog_->PutShard(**r); !s.ok()) {
    CKPT_LOG_WARN("{}: recording its skipped persist: {}",
                  Describe(id.job, id.step, id.rank), s.ToString());
    return;
  }
  metrics_.Add("ckpt_persists_skipped_total", {{"job", id.job}});
  CKPT_LOG_DEBUG("{}: not persisted, step {} came first (--persist-newest)",
                 Describe(id.job, id.step, id.rank), newer);
  // Its memory copy may go now.
  queue_.RequestGc(id.job);
}

void CheckpointService::WaitIdle() {
  queue_.WaitIdle();
  // Files retention dropped are deleted in the background.
  recycler_->WaitDeleted();
}

}  // namespace ckpt::daemon

namespace ckpt::daemon {

absl::Status CheckpointService::Liveness(absl::Duration stall) const {
  return liveness_.Check(stall, absl::Now());
}

}  // namespace ckpt::daemon
