// CheckpointService: the metrics ckptd exports (/metrics, ckpt status),
// declared once with their help, and the gauges read at every scrape. Those
// of jobs' rhythm and failures are JobHealth's (daemon/health/).
#include "daemon/service/checkpoint_service.h"
#include "io/file_system.h"

namespace ckpt::daemon {

void CheckpointService::DeclareMetrics() {
  using T = Metrics::Type;
  const std::vector<double> seconds = Metrics::SecondsBuckets();
  metrics_.Declare("ckpt_staged_bytes_total", T::kCounter,
                   "bytes handed to ckptd in staging slots");
  metrics_.Declare("ckpt_persisted_bytes_total", T::kCounter,
                   "raw bytes persisted to local disk");
  metrics_.Declare("ckpt_persisted_stored_bytes_total", T::kCounter,
                   "bytes written to local disk for them (after compression)");
  metrics_.Declare("ckpt_persist_unchanged_bytes_total", T::kCounter,
                   "raw bytes of incremental saves left unchanged in earlier "
                   "shards, not written again");
  metrics_.Declare("ckpt_persist_seconds", T::kHistogram,
                   "time to persist one shard (encode, write, sync, vote)",
                   seconds);
  metrics_.Declare("ckpt_compression_ratio", T::kGauge,
                   "stored/raw bytes of the last persisted shard");
  metrics_.Declare("ckpt_persist_chunks_total", T::kCounter,
                   "persisted chunks by what became of them: compressed, "
                   "raw_chosen (the adaptive codec stored them raw so the "
                   "disk need not wait for the compressor), "
                   "raw_incompressible, unchanged (left in a base shard)");
  metrics_.Declare("ckpt_persist_xor_delta_chunks_total", T::kCounter,
                   "persisted chunks stored compressed as the XOR with the "
                   "same chunk of the rank's previous save (among the "
                   "compressed ones)");
  metrics_.Declare("ckpt_codec_effort", T::kGauge,
                   "the adaptive codec's effort: below 1 the fraction of "
                   "chunks compressed, 1 all at --zstd-level, above 1 some "
                   "at higher levels");
  metrics_.Declare("ckpt_codec_raw_write_bytes_per_second", T::kGauge,
                   "the rate of persisting raw chunks, as the adaptive codec "
                   "last measured it: compressing must not persist slower");
  metrics_.Declare("ckpt_disk_recycled_bytes", T::kGauge,
                   "bytes of retired shard files kept for the next persists "
                   "to write over");
  metrics_.Declare("ckpt_persist_failures_total", T::kCounter,
                   "shards that failed to persist (ENOSPC, EIO, ...)");
  metrics_.Declare("ckpt_steps_skipped_total", T::kCounter,
                   "saves refused for lack of staging memory");
  metrics_.Declare("ckpt_recovered_shards_total", T::kCounter,
                   "staged shards adopted after a daemon restart");
  metrics_.Declare("ckpt_memory_tier_bytes", T::kGauge,
                   "bytes of live staging slots");
  metrics_.Declare("ckpt_memory_tier_free_slot_bytes", T::kGauge,
                   "bytes of released slots kept for reuse");
  metrics_.Declare("ckpt_memory_budget_bytes", T::kGauge,
                   "the staging memory budget (--memory-budget)");
  metrics_.Declare("ckpt_memory_evictions_total", T::kCounter,
                   "memory-tier copies dropped while safe at a durable tier, "
                   "by reason: idle_job, older_step, newest_step (a save "
                   "found the budget full), idle_ttl "
                   "(--idle-job-memory-ttl), operator (ckpt gc --memory)");
  metrics_.Declare("ckpt_memory_evicted_bytes_total", T::kCounter,
                   "bytes of those copies");
  metrics_.Declare("ckpt_persists_skipped_total", T::kCounter,
                   "staged shards not persisted because a newer save of "
                   "their rank came first (--persist-newest)");
  metrics_.Declare("ckpt_persist_retries_total", T::kCounter,
                   "failed persists tried again because memory was short "
                   "and their slot was still there");
  metrics_.Declare("ckpt_trainers_attached", T::kGauge,
                   "trainer sessions open (libckpt Checkpointers) per job");
  metrics_.Declare("ckpt_coordinator_rejoins", T::kGauge,
                   "times this ckptd took a new etcd lease after its lease "
                   "expired (fenced, then rejoined), since it started");
  metrics_.Declare("ckpt_restores_total", T::kCounter,
                   "restores by rank that read from a source tier (a "
                   "resharded restore may count for two)");
  metrics_.Declare("ckpt_restored_bytes_total", T::kCounter,
                   "bytes restores read, by source tier");
  metrics_.Declare("ckpt_checksum_mismatches_total", T::kCounter,
                   "memory-tier copies whose bytes did not match the "
                   "persisted checksums at restore");
  metrics_.Declare("ckpt_restore_fallbacks_total", T::kCounter,
                   "restores that gave up a source for the next one");
  metrics_.Declare("ckpt_shards_withdrawn_total", T::kCounter,
                   "uncommitted shards withdrawn because their rank resumed "
                   "from an older step (a killed run's saves)");
  metrics_.Declare("ckpt_disk_tier_bytes", T::kGauge,
                   "bytes of the shard files kept in the data directory");
  metrics_.Declare("ckpt_disk_budget_bytes", T::kGauge,
                   "what the data directory's file system can hold for "
                   "ckpt: its shard files plus the free space");
  metrics_.OnScrape([this](Metrics& m) {
    m.Set("ckpt_memory_tier_bytes", {},
          static_cast<double>(arena_->used_bytes()));
    m.Set("ckpt_memory_tier_free_slot_bytes", {},
          static_cast<double>(arena_->free_bytes()));
    m.Set("ckpt_memory_budget_bytes", {},
          static_cast<double>(arena_->budget_bytes()));
    for (const auto& [job, a] : activity_.All()) {
      m.Set("ckpt_trainers_attached", {{"job", job}}, a.sessions);
    }
    m.Set("ckpt_coordinator_rejoins", {}, coordinator_->Rejoins());
    uint64_t disk = 0;
    auto shards = catalog_->ListShards();
    if (shards.ok()) {
      for (const proto::ShardRecord& r : *shards) {
        if (!r.shard_path().empty()) disk += r.stored_bytes();
      }
      m.Set("ckpt_disk_tier_bytes", {}, static_cast<double>(disk));
    }
    m.Set("ckpt_disk_recycled_bytes", {},
          static_cast<double>(recycler_->bytes()));
    auto free_space = fs_->FreeSpace(options_.data_dir);
    if (free_space.ok() && shards.ok()) {
      m.Set("ckpt_disk_budget_bytes", {},
            static_cast<double>(disk + *free_space));
    }
  });
}

}  // namespace ckpt::daemon
