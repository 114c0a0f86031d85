// CheckpointService: the persist pipeline. Staged shards queue up; persist
// threads write each to its shard file (chunked, compressed, checksummed,
// through the FileSystem), record it and vote it at TIER_LOCAL_DISK. A failed
// persist marks the shard SHARD_FAILED with its slot kept, for
// RetryFailedPersists (checkpoint_service_memory.cc) to try again.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/common/describe.h"
#include "daemon/common/records.h"
#include "daemon/service/checkpoint_service.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"

namespace ckpt::daemon {

void CheckpointService::PersistLoop() {
  while (true) {
    SlotId id;
    std::string gc_job;
    {
      absl::MutexLock lock(&mu_);
      // The first queued shard whose rank is not already being persisted; later
      // steps of a busy rank wait their turn, so every rank persists in step
      // order. Persisting goes before garbage collection.
      auto first_ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return std::find_if(queue_.begin(), queue_.end(),
                            [this](const SlotId& q) {
                              mu_.AssertHeld();
                              return busy_.count({q.job, q.rank}) == 0;
                            });
      };
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || first_ready() != queue_.end() ||
               !gc_wanted_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      auto it = first_ready();
      if (it != queue_.end()) {
        id = *it;
        queue_.erase(it);
        busy_[{id.job, id.rank}] = id.step;
      } else {
        gc_job = *gc_wanted_.begin();
        gc_wanted_.erase(gc_wanted_.begin());
        ++gc_running_;
      }
    }
    RevoteIfRejoined();
    if (!gc_job.empty()) {
      const absl::Time gc_start = absl::Now();
      CollectGarbage(gc_job);
      const absl::Duration gc = absl::Now() - gc_start;
      if (gc > absl::Milliseconds(100)) {
        CKPT_LOG_INFO("job {}: garbage collection took {:.1f} ms", gc_job,
                      absl::ToDoubleMilliseconds(gc));
      }
      if (std::optional<StagingArena::Shortage> short_of = arena_->Waiting())
        RelieveMemoryPressure(short_of->id.job, short_of->bytes);
      absl::MutexLock lock(&mu_);
      --gc_running_;
      ++generation_;
      continue;
    }
    absl::StatusOr<absl::optional<proto::ShardRecord>> record =
        catalog_->GetShard(id.job, id.step, id.rank);
    if (record.ok() && record->has_value() &&
        (*record)->state() == proto::SHARD_STAGED) {
      proto::ShardRecord& r = **record;
      absl::Status s = Persist(r);
      if (s.code() == absl::StatusCode::kCancelled) {
        // The daemon is stopping: the shard stays staged for the next start.
        CKPT_LOG_WARN("{}: persist stopped, the shard stays staged: {}",
                      Describe(id.job, id.step, id.rank), s.ToString());
      } else if (!s.ok()) {
        CKPT_LOG_ERROR("{}: persist failed: {}",
                       Describe(id.job, id.step, id.rank), s.ToString());
        metrics_.Add("ckpt_persist_failures_total", {{"job", id.job}});
        // Out of space: the kept files give theirs back for the next try.
        if (s.code() == absl::StatusCode::kResourceExhausted)
          recycler_->Clear();
        r.set_state(proto::SHARD_FAILED);
        r.set_error(std::string(s.message()));
        absl::Status put = catalog_->PutShard(r);
        if (!put.ok())
          CKPT_LOG_ERROR("recording the failure: {}", put.ToString());
      }
    } else if (!record.ok()) {
      CKPT_LOG_ERROR("{}: catalog read failed: {}",
                     Describe(id.job, id.step, id.rank),
                     record.status().ToString());
    }
    // A save waiting for memory may be helped by the copy just persisted.
    if (std::optional<StagingArena::Shortage> short_of = arena_->Waiting())
      RelieveMemoryPressure(short_of->id.job, short_of->bytes);
    // The rank's next shard may start persisting on one thread while another
    // collects garbage (unlinking a large file takes a while).
    absl::MutexLock lock(&mu_);
    busy_.erase({id.job, id.rank});
    gc_wanted_.insert(id.job);
    ++generation_;
  }
}

absl::Status CheckpointService::Persist(proto::ShardRecord& r) {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::shared_ptr<io::MappedFile> slot,
                   arena_->Map({r.job(), r.step(), r.rank()}));
  if (slot->size() < r.slot_bytes()) {
    return absl::DataLossError(
        absl::StrCat("staging slot ", r.slot_path(), " has ", slot->size(),
                     " bytes, expected ", r.slot_bytes()));
  }
  const absl::Time mapped = absl::Now();
  const std::string path = ShardPath(r.job(), r.step(), r.rank());
  RETURN_IF_ERROR(fs_->CreateDirs(io::DirName(path)));
  snapshot::ShardWriterOptions writer_options = options_.writer;
  writer_options.recycle_from = recycler_->Take(r.slot_bytes());
  writer_options.base = PinBase(r);
  const SlotId id{r.job(), r.step(), r.rank()};
  writer_options.on_chunk = [this, &id] {
    absl::MutexLock live(&live_mu_);
    persisting_[id] = absl::Now();
  };
  {
    absl::MutexLock live(&live_mu_);
    persisting_[id] = absl::Now();
  }
  struct Done {
    CheckpointService* service;
    const SlotId& id;
    ~Done() {
      absl::MutexLock live(&service->live_mu_);
      service->persisting_.erase(id);
    }
  } done{this, id};
  // The pin holds until the record naming the base is stored (or this fails).
  struct Unpin {
    CheckpointService* service;
    const proto::ShardRecord& r;
    const std::shared_ptr<const snapshot::ShardBase>& base;
    ~Unpin() { service->UnpinBase(r, base); }
  } unpin{this, r, writer_options.base};
  snapshot::ShardWriter writer(
      fs_, path, {r.job(), r.step(), r.rank(), r.world_size()}, writer_options);
  for (const proto::StagedItem& staged : r.items()) {
    const proto::Item& item = staged.item();
    absl::Span<const uint8_t> data(slot->data() + staged.slot_offset(),
                                   item.raw_size());
    // The client's hashes, of the chunks this writer makes (StageComplete
    // checked their size and count).
    absl::Span<const uint64_t> known;
    if (staged.chunk_size() == writer_options.chunk_size) {
      known = absl::MakeConstSpan(staged.chunk_xxh3().data(),
                                  staged.chunk_xxh3_size());
    }
    if (item.kind() == proto::ITEM_KIND_TENSOR) {
      RETURN_IF_ERROR(
          writer.AddTensor({item.name(), item.dtype(),
                            std::vector<int64_t>(item.global_shape().begin(),
                                                 item.global_shape().end()),
                            std::vector<int64_t>(item.box_offset().begin(),
                                                 item.box_offset().end()),
                            std::vector<int64_t>(item.box_length().begin(),
                                                 item.box_length().end()),
                            data, known}));
    } else {
      RETURN_IF_ERROR(writer.AddBytes(item.name(), data, known));
    }
  }
  ASSIGN_OR_RETURN(proto::ShardManifest manifest, writer.Commit());
  const absl::Time written = absl::Now();
  {
    // The watchdog watches the disk; a slow coordinator (the vote below) is
    // no reason to restart the daemon.
    absl::MutexLock live(&live_mu_);
    persisting_.erase(id);
  }
  CKPT_KILL_POINT("service.after_shard_commit");
  // What this file stores, and what it leaves in its bases.
  uint64_t raw = 0, stored = 0, reused = 0;
  for (const proto::Item& item : manifest.items()) {
    raw += item.raw_size();
    for (const proto::ChunkInfo& c : item.chunks()) {
      if (c.base() == 0) {
        stored += c.stored_size();
      } else {
        reused += c.raw_size();
      }
    }
  }
  r.clear_base_steps();
  for (const proto::BaseShard& b : manifest.bases()) r.add_base_steps(b.step());
  r.set_state(proto::SHARD_PERSISTED);
  r.clear_error();  // an earlier attempt's (RetryFailedPersists)
  r.set_shard_path(path);
  r.set_raw_bytes(raw);
  r.set_stored_bytes(stored);
  r.set_persisted_unix_micros(NowMicros());
  RETURN_IF_ERROR(catalog_->PutShard(r));
  CKPT_KILL_POINT("service.after_persisted_record");
  RememberBase(r, std::move(manifest), writer.manifest_xxh3());
  // The shard is persisted whatever the vote does: a vote refused (a node
  // fenced past its lease) is made again once the node rejoined.
  absl::StatusOr<std::vector<proto::Tier>> voted = coordinator_->Vote(
      r.job(), r.step(), r.rank(), r.world_size(), {proto::TIER_LOCAL_DISK});
  if (!voted.ok()) {
    CKPT_LOG_WARN("{}: local-disk vote failed: {}",
                  Describe(r.job(), r.step(), r.rank()),
                  voted.status().ToString());
  }
  const std::vector<proto::Tier> committed =
      voted.ok() ? *std::move(voted) : std::vector<proto::Tier>();
  const Labels job_label = {{"job", r.job()}};
  metrics_.Add("ckpt_persisted_bytes_total", job_label,
               static_cast<double>(raw));
  metrics_.Add("ckpt_persisted_stored_bytes_total", job_label,
               static_cast<double>(stored));
  metrics_.Add("ckpt_persist_unchanged_bytes_total", job_label,
               static_cast<double>(reused));
  metrics_.Observe("ckpt_persist_seconds", job_label,
                   absl::ToDoubleSeconds(absl::Now() - start));
  const snapshot::ShardWriteStats& chunks = writer.stats();
  for (const auto& [what, count] :
       {std::pair<const char*, uint64_t>{"compressed", chunks.compressed},
        {"raw_chosen", chunks.raw_chosen},
        {"raw_incompressible", chunks.raw_incompressible},
        {"unchanged", chunks.unchanged}}) {
    if (count > 0) {
      metrics_.Add("ckpt_persist_chunks_total", {{"stored", what}},
                   static_cast<double>(count));
    }
  }
  double effort = 1.0;
  double raw_rate = 0;
  if (options_.writer.governor != nullptr) {
    const snapshot::CodecGovernor::Stats g = options_.writer.governor->stats();
    effort = g.effort;
    raw_rate = g.raw_mib_s;
    metrics_.Set("ckpt_codec_effort", {}, effort);
    if (raw_rate > 0) {
      metrics_.Set("ckpt_codec_raw_write_bytes_per_second", {},
                   raw_rate * (1 << 20));
    }
  }
  if (raw > 0) {
    metrics_.Set("ckpt_compression_ratio", job_label,
                 static_cast<double>(stored) / static_cast<double>(raw));
  }
  Committed(r.job(), r.step(), committed);
  if (replicator_ != nullptr) replicator_->Enqueue(r);
  if (parity_ != nullptr) parity_->Enqueue(r);
  if (shared_ != nullptr && shared_->Wants(r.step())) shared_->Enqueue(r);
  const absl::Time end = absl::Now();
  const double seconds = absl::ToDoubleSeconds(end - start);
  CKPT_LOG_INFO(
      "{}: persisted {} bytes ({} stored, {} unchanged in {} base shards) in "
      "{:.1f} ms, {:.0f} MiB/s (map {:.1f} ms, write+sync {:.1f} ms, "
      "catalog+vote {:.1f} ms); chunks: {} compressed, {} raw by choice, {} "
      "raw incompressible, {} unchanged; codec effort now {:.2f} (raw "
      "persists measured at {:.0f} MiB/s)",
      Describe(r.job(), r.step(), r.rank()), raw, stored, reused,
      r.base_steps_size(), seconds * 1e3,
      seconds > 0 ? raw / seconds / (1 << 20) : 0.0,
      absl::ToDoubleMilliseconds(mapped - start),
      absl::ToDoubleMilliseconds(written - mapped),
      absl::ToDoubleMilliseconds(end - written), chunks.compressed,
      chunks.raw_chosen, chunks.raw_incompressible, chunks.unchanged, effort,
      raw_rate);
  return absl::OkStatus();
}

}  // namespace ckpt::daemon
