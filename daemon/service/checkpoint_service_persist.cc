// CheckpointService: the persist pipeline. Staged shards queue up; persist
// threads write each to its shard file (chunked, compressed, checksummed,
// through the FileSystem), record it and vote it at TIER_LOCAL_DISK. A failed
// persist marks the shard SHARD_FAILED with its slot kept, for
// RetryFailedPersists (checkpoint_service_memory.cc) to try again.
#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/describe.h"
#include "daemon/common/records.h"
#include "daemon/service/checkpoint_service.h"
#include "io/background.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"

namespace ckpt::daemon {

void CheckpointService::PersistLoop() {
  // Persists and their codec threads give way to the trainers' copies.
  io::EnterBackground();
  while (std::optional<PersistQueue::Work> work = queue_.Next()) {
    RevoteIfRejoined();
    if (work->shard.has_value()) {
      PersistQueued(*work->shard);
    } else {
      CollectQueued(work->gc_job);
    }
    // A save waiting for memory may be helped by the copy just persisted or
    // the garbage just collected.
    if (std::optional<StagingArena::Shortage> short_of = arena_->Waiting())
      RelieveMemoryPressure(short_of->id.job, short_of->bytes);
    if (work->shard.has_value()) {
      // The rank's next shard may start persisting on one thread while
      // another collects garbage (unlinking a large file takes a while).
      queue_.Done(*work->shard);
    } else {
      queue_.GcDone();
    }
    changes_.Bump();
  }
}

void CheckpointService::CollectQueued(const std::string& job) {
  const absl::Time start = absl::Now();
  CollectGarbage(job);
  const absl::Duration took = absl::Now() - start;
  if (took > absl::Milliseconds(100)) {
    CKPT_LOG_INFO("job {}: garbage collection took {:.1f} ms", job,
                  absl::ToDoubleMilliseconds(took));
  }
}

void CheckpointService::PersistQueued(const SlotId& id) {
  absl::StatusOr<absl::optional<proto::ShardRecord>> record =
      catalog_->GetShard(id.job, id.step, id.rank);
  if (!record.ok()) {
    CKPT_LOG_ERROR("{}: catalog read failed: {}",
                   Describe(id.job, id.step, id.rank),
                   record.status().ToString());
    return;
  }
  // Withdrawn, or persisted already.
  if (!record->has_value() || (*record)->state() != proto::SHARD_STAGED) return;
  proto::ShardRecord& r = **record;
  absl::Status s = Persist(r);
  if (s.ok()) {
    failures_.Healed(id.job, "disk_error", absl::Now());
    return;
  }
  if (s.code() == absl::StatusCode::kCancelled) {
    // The daemon is stopping: the shard stays staged for the next start.
    CKPT_LOG_WARN("{}: persist stopped, the shard stays staged: {}",
                  Describe(id.job, id.step, id.rank), s.ToString());
    return;
  }
  CKPT_LOG_ERROR("{}: persist failed: {}", Describe(id.job, id.step, id.rank),
                 s.ToString());
  metrics_.Add("ckpt_persist_failures_total", {{"job", id.job}});
  failures_.FailedEpisode(id.job, "disk_error",
                          absl::StrCat(Describe(id.job, id.step, id.rank),
                                       ": persist failed: ", s.message()),
                          absl::Now());
  // Out of space: the kept files give theirs back for the next try.
  if (s.code() == absl::StatusCode::kResourceExhausted) recycler_->Clear();
  r.set_state(proto::SHARD_FAILED);
  r.set_error(std::string(s.message()));
  absl::Status put = catalog_->PutShard(r);
  if (!put.ok()) CKPT_LOG_ERROR("recording the failure: {}", put.ToString());
}

namespace {

// Adds the slot's staged items to `writer`, with the client's chunk hashes
// where they are of the chunks the writer makes.
absl::Status AddStagedItems(const proto::ShardRecord& r, io::MappedFile& slot,
                            uint32_t chunk_size,
                            snapshot::ShardWriter& writer) {
  for (const proto::StagedItem& staged : r.items()) {
    const proto::Item& item = staged.item();
    absl::Span<const uint8_t> data(slot.data() + staged.slot_offset(),
                                   item.raw_size());
    // StageComplete checked their size and count.
    absl::Span<const uint64_t> known;
    if (staged.chunk_size() == chunk_size) {
      known = absl::MakeConstSpan(staged.chunk_xxh3().data(),
                                  staged.chunk_xxh3_size());
    }
    auto dims = [](const auto& v) {
      return std::vector<int64_t>(v.begin(), v.end());
    };
    if (item.kind() == proto::ITEM_KIND_TENSOR) {
      RETURN_IF_ERROR(writer.AddTensor(
          {item.name(), item.dtype(), dims(item.global_shape()),
           dims(item.box_offset()), dims(item.box_length()), data, known}));
    } else {
      RETURN_IF_ERROR(writer.AddBytes(item.name(), data, known));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckpointService::Persist(proto::ShardRecord& r) {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::shared_ptr<io::MappedFile> slot, MapStaged(r));
  const absl::Time mapped = absl::Now();
  const std::string path = ShardPath(r.job(), r.step(), r.rank());
  // The pin holds until the record naming the base is stored (or this fails).
  const std::shared_ptr<const snapshot::ShardBase> base = PinBase(r);
  absl::Cleanup unpin = [&] { UnpinBase(r, base); };
  ASSIGN_OR_RETURN(WrittenShard written, WriteShard(r, *slot, path, base));
  const absl::Time written_at = absl::Now();
  CKPT_KILL_POINT("service.after_shard_commit");
  // Before the disk vote, whose commit may compare them.
  audit_->PostPersisted(r, written.manifest);
  const snapshot::ShardWriteStats chunks = written.stats;
  ASSIGN_OR_RETURN(ShardSizes sizes,
                   RecordPersisted(r, path, std::move(written)));
  std::move(unpin).Invoke();
  // The shard is persisted whatever the vote does: a vote refused (a node
  // fenced past its lease) is made again once the node rejoined.
  const std::vector<proto::Tier> committed = VoteLocalDisk(r);
  CountPersist(r, sizes, chunks, absl::Now() - start);
  Committed(r.job(), r.step(), committed);
  HandOff(r);
  const absl::Time end = absl::Now();
  const double seconds = absl::ToDoubleSeconds(end - start);
  CKPT_LOG_INFO(
      "{}: persisted {} bytes ({} stored, {} unchanged in {} base shards) in "
      "{:.1f} ms, {:.0f} MiB/s (map {:.1f} ms, write+sync {:.1f} ms, "
      "catalog+vote {:.1f} ms); chunks: {} compressed ({} as XOR deltas), {} "
      "raw by choice, {} raw incompressible, {} unchanged",
      Describe(r.job(), r.step(), r.rank()), sizes.raw, sizes.stored,
      sizes.reused, r.base_steps_size(), seconds * 1e3,
      seconds > 0 ? sizes.raw / seconds / (1 << 20) : 0.0,
      absl::ToDoubleMilliseconds(mapped - start),
      absl::ToDoubleMilliseconds(written_at - mapped),
      absl::ToDoubleMilliseconds(end - written_at), chunks.compressed,
      chunks.deltas, chunks.raw_chosen, chunks.raw_incompressible,
      chunks.unchanged);
  return absl::OkStatus();
}

// What a manifest's file stores, and what it leaves in its bases.
CheckpointService::ShardSizes CheckpointService::SizesOf(
    const proto::ShardManifest& manifest) {
  ShardSizes sizes;
  for (const proto::Item& item : manifest.items()) {
    sizes.raw += item.raw_size();
    for (const proto::ChunkInfo& c : item.chunks()) {
      if (c.base() == 0) {
        sizes.stored += c.stored_size();
      } else {
        sizes.reused += c.raw_size();
      }
    }
  }
  return sizes;
}

absl::StatusOr<std::shared_ptr<io::MappedFile>> CheckpointService::MapStaged(
    const proto::ShardRecord& r) {
  ASSIGN_OR_RETURN(std::shared_ptr<io::MappedFile> slot,
                   arena_->Map({r.job(), r.step(), r.rank()}));
  if (slot->size() < r.slot_bytes()) {
    return absl::DataLossError(
        absl::StrCat("staging slot ", r.slot_path(), " has ", slot->size(),
                     " bytes, expected ", r.slot_bytes()));
  }
  return slot;
}

absl::StatusOr<CheckpointService::WrittenShard> CheckpointService::WriteShard(
    const proto::ShardRecord& r, io::MappedFile& slot, const std::string& path,
    std::shared_ptr<const snapshot::ShardBase> base) {
  RETURN_IF_ERROR(fs_->CreateDirs(io::DirName(path)));
  snapshot::ShardWriterOptions writer_options = options_.writer;
  writer_options.recycle_from = recycler_->Take(r.slot_bytes());
  writer_options.base = WithBaseBytes(r, std::move(base));
  // The housekeeper's liveness check watches every chunk written; a slow
  // coordinator afterwards (the vote) is no reason to restart the daemon.
  const SlotId id{r.job(), r.step(), r.rank()};
  auto alive = [this, &id] { liveness_.PersistProgressed(id, absl::Now()); };
  writer_options.on_chunk = alive;
  alive();
  absl::Cleanup done = [this, &id] { liveness_.PersistEnded(id); };
  snapshot::ShardWriter writer(
      fs_, path, {r.job(), r.step(), r.rank(), r.world_size()}, writer_options);
  RETURN_IF_ERROR(AddStagedItems(r, slot, writer_options.chunk_size, writer));
  ASSIGN_OR_RETURN(proto::ShardManifest manifest, writer.Commit());
  return WrittenShard{std::move(manifest), writer.manifest_xxh3(),
                      writer.stats()};
}

absl::StatusOr<CheckpointService::ShardSizes>
CheckpointService::RecordPersisted(proto::ShardRecord& r,
                                   const std::string& path,
                                   WrittenShard written) {
  const ShardSizes sizes = SizesOf(written.manifest);
  r.clear_base_steps();
  for (const proto::BaseShard& b : written.manifest.bases()) {
    r.add_base_steps(b.step());
  }
  r.set_state(proto::SHARD_PERSISTED);
  r.clear_persist_skipped();
  r.clear_error();  // an earlier attempt's (RetryFailedPersists)
  r.set_shard_path(path);
  r.set_raw_bytes(sizes.raw);
  r.set_stored_bytes(sizes.stored);
  r.set_persisted_unix_micros(NowMicros());
  RETURN_IF_ERROR(catalog_->PutShard(r));
  CKPT_KILL_POINT("service.after_persisted_record");
  RememberBase(r, std::move(written.manifest), written.manifest_xxh3);
  return sizes;
}

std::vector<proto::Tier> CheckpointService::VoteLocalDisk(
    const proto::ShardRecord& r) {
  absl::StatusOr<std::vector<proto::Tier>> voted = coordinator_->Vote(
      r.job(), r.step(), r.rank(), r.world_size(), {proto::TIER_LOCAL_DISK});
  if (!voted.ok()) {
    CKPT_LOG_WARN("{}: local-disk vote failed: {}",
                  Describe(r.job(), r.step(), r.rank()),
                  voted.status().ToString());
    return {};
  }
  return *std::move(voted);
}

void CheckpointService::CountPersist(const proto::ShardRecord& r,
                                     const ShardSizes& sizes,
                                     const snapshot::ShardWriteStats& chunks,
                                     absl::Duration took) {
  const Labels job_label = {{"job", r.job()}};
  metrics_.Add("ckpt_persisted_bytes_total", job_label,
               static_cast<double>(sizes.raw));
  metrics_.Add("ckpt_persisted_stored_bytes_total", job_label,
               static_cast<double>(sizes.stored));
  metrics_.Add("ckpt_persist_unchanged_bytes_total", job_label,
               static_cast<double>(sizes.reused));
  metrics_.Observe("ckpt_persist_seconds", job_label,
                   absl::ToDoubleSeconds(took));
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
  if (chunks.deltas > 0) {
    metrics_.Add("ckpt_persist_xor_delta_chunks_total", job_label,
                 static_cast<double>(chunks.deltas));
  }
  if (options_.writer.governor != nullptr) {
    const snapshot::CodecGovernor::Stats g = options_.writer.governor->stats();
    metrics_.Set("ckpt_codec_effort", {}, g.effort);
    if (g.raw_mib_s > 0) {
      metrics_.Set("ckpt_codec_raw_write_bytes_per_second", {},
                   g.raw_mib_s * (1 << 20));
    }
  }
  if (sizes.raw > 0) {
    metrics_.Set(
        "ckpt_compression_ratio", job_label,
        static_cast<double>(sizes.stored) / static_cast<double>(sizes.raw));
  }
}

void CheckpointService::HandOff(const proto::ShardRecord& r) {
  if (replicator_ != nullptr) replicator_->Enqueue(r);
  if (parity_ != nullptr) parity_->Enqueue(r);
  if (shared_ != nullptr && shared_->Wants(r.step())) shared_->Enqueue(r);
}

}  // namespace ckpt::daemon
