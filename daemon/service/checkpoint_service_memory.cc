// CheckpointService: the memory tier as a cache. Copies that are safe at a
// durable tier give way to a save that finds the budget full (in the order
// memory_pressure.h gives), to an operator (ckpt gc JOB --memory), and to
// time: a job with no trainer attached for --idle-job-memory-ttl gives up all
// of them. Every drop goes through ApplyDrops under gc_mu_, like garbage
// collection's, so a record is never rewritten from a stale snapshot.
#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/service/checkpoint_service.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {
namespace {

std::string MiB(uint64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

// Whether a reader (a restore, ckpt verify) holds the slot now.
bool Pinned(const proto::ShardRecord& shard) {
  absl::StatusOr<bool> in_use =
      io::DefaultFileSystem()->InUse(shard.slot_path());
  return in_use.ok() && *in_use;
}

constexpr char kPinned[] = "a reader holds it (a restore)";

}  // namespace

absl::StatusOr<std::vector<MemoryCopy>> CheckpointService::MemoryCopies(
    const std::string& job) {
  std::vector<proto::ShardRecord> shards;
  if (job.empty()) {
    ASSIGN_OR_RETURN(shards, catalog_->ListShards());
  } else {
    ASSIGN_OR_RETURN(shards, catalog_->ListShards(job));
  }
  // Per job: the steps the peer and shared tiers keep.
  std::map<std::string, std::set<uint64_t>> elsewhere;
  std::vector<MemoryCopy> out;
  for (proto::ShardRecord& r : shards) {
    if (r.slot_path().empty()) continue;
    auto it = elsewhere.find(r.job());
    if (it == elsewhere.end()) {
      std::set<uint64_t> kept;
      if (replicator_ != nullptr || shared_ != nullptr) {
        ASSIGN_OR_RETURN(std::vector<proto::CommitRecord> c,
                         coordinator_->ListCommits(r.job()));
        kept = KeptElsewhere(c);
      }
      it = elsewhere.emplace(r.job(), std::move(kept)).first;
    }
    MemoryCopy copy;
    copy.kept = WhyKept(r, it->second);
    copy.shard = std::move(r);
    out.push_back(std::move(copy));
  }
  return out;
}

uint64_t CheckpointService::Evict(const std::vector<Eviction>& evictions) {
  std::vector<RetentionAction> actions;
  for (const Eviction& e : evictions) {
    RetentionAction a;
    a.shard = e.shard;
    a.drop_slot = true;
    actions.push_back(std::move(a));
  }
  auto [applied, failed] = ApplyDrops(actions);
  if (!failed.ok()) {
    CKPT_LOG_WARN("evicting memory-tier copies: {}", failed.ToString());
  }
  // What went, per job and reason, for the log and the metrics.
  std::map<std::pair<std::string, EvictionReason>,
           std::pair<std::set<uint64_t>, uint64_t>>
      went;
  uint64_t freed = 0;
  for (size_t i = 0; i < applied; ++i) {
    const Eviction& e = evictions[i];
    const Labels labels = {{"job", e.shard.job()},
                           {"reason", std::string(ReasonName(e.reason))}};
    metrics_.Add("ckpt_memory_evictions_total", labels);
    metrics_.Add("ckpt_memory_evicted_bytes_total", labels,
                 static_cast<double>(e.shard.slot_bytes()));
    auto& [steps, bytes] = went[{e.shard.job(), e.reason}];
    steps.insert(e.shard.step());
    bytes += e.shard.slot_bytes();
    freed += e.shard.slot_bytes();
  }
  for (const auto& [key, what] : went) {
    CKPT_LOG_INFO(
        "memory tier: dropped job {} step(s) {} ({}, {}); they stay on disk "
        "or at peers",
        key.first, absl::StrJoin(what.first, ","), MiB(what.second),
        std::string(ReasonName(key.second)));
  }
  return freed;
}

uint64_t CheckpointService::RelieveMemoryPressure(const std::string& job,
                                                  uint64_t needed) {
  if (needed == 0) return 0;
  absl::MutexLock gc(&gc_mu_);
  absl::StatusOr<std::vector<MemoryCopy>> copies = MemoryCopies("");
  if (!copies.ok()) {
    CKPT_LOG_WARN("memory pressure: listing memory-tier copies: {}",
                  copies.status().ToString());
    return 0;
  }
  PressureInput in;
  in.copies = *std::move(copies);
  in.jobs = activity_.All();
  in.saving_job = job;
  in.now = absl::Now();
  in.pinned = Pinned;
  std::vector<Eviction> plan = PlanEviction(in, needed);
  if (plan.empty()) {
    RetryFailedPersists(in.copies);
    return 0;
  }
  return Evict(plan);
}

void CheckpointService::RetryFailedPersists(
    const std::vector<MemoryCopy>& copies) {
  constexpr absl::Duration kEvery = absl::Seconds(2);
  const absl::Time now = absl::Now();
  for (const MemoryCopy& c : copies) {
    if (c.shard.state() != proto::SHARD_FAILED) continue;
    const SlotId id{c.shard.job(), c.shard.step(), c.shard.rank()};
    auto [last, first] = retried_.try_emplace(id, now);
    if (!first && now - last->second < kEvery) continue;
    last->second = now;
    proto::ShardRecord r = c.shard;
    r.set_state(proto::SHARD_STAGED);  // keeps the error it failed with
    if (absl::Status s = catalog_->PutShard(r); !s.ok()) {
      CKPT_LOG_WARN(
          "{}: persisting again: {}",
          absl::StrCat("job ", id.job, " step ", id.step, " rank ", id.rank),
          s.ToString());
      continue;
    }
    CKPT_LOG_INFO(
        "job {} step {} rank {}: memory is short and this shard's persist "
        "failed ({}); persisting it again",
        id.job, id.step, id.rank, c.shard.error());
    metrics_.Add("ckpt_persist_retries_total", {{"job", id.job}});
    Enqueue(id);
  }
  // Forget shards that are gone or persisted.
  for (auto it = retried_.begin(); it != retried_.end();) {
    it = now - it->second > absl::Minutes(10) ? retried_.erase(it)
                                              : std::next(it);
  }
}

void CheckpointService::DropIdleJobsMemory() {
  if (arena_->used_bytes() == 0) return;
  absl::MutexLock gc(&gc_mu_);
  absl::StatusOr<std::vector<MemoryCopy>> copies = MemoryCopies("");
  if (!copies.ok()) return;
  const absl::Time now = absl::Now();
  std::vector<Eviction> idle;
  for (const MemoryCopy& c : *copies) {
    if (!c.kept.empty()) continue;
    const JobActivity::Job job = activity_.Get(c.shard.job());
    if (job.sessions > 0 ||
        now - job.LastActive(now) < options_.idle_job_memory_ttl ||
        Pinned(c.shard)) {
      continue;
    }
    idle.push_back({c.shard, EvictionReason::kIdleTtl});
  }
  if (!idle.empty()) Evict(idle);
}

void CheckpointService::Housekeeping() {
  // A save waiting for memory is looked after twice a second: failed
  // persists tried again may succeed with nothing else going on.
  constexpr absl::Duration kTick = kHousekeepingTick;
  const bool ttl = options_.idle_job_memory_ttl != absl::InfiniteDuration();
  const absl::Duration sweep_every =
      ttl ? std::clamp(options_.idle_job_memory_ttl / 4,
                       absl::Milliseconds(100), absl::Seconds(30))
          : absl::InfiniteDuration();
  absl::Time swept = absl::Now();
  while (true) {
    liveness_.HousekeepingRound(absl::Now());
    if (queue_.WaitForStop(std::min(kTick, sweep_every))) return;
    if (std::optional<StagingArena::Shortage> short_of = arena_->Waiting())
      RelieveMemoryPressure(short_of->id.job, short_of->bytes);
    if (ttl && absl::Now() - swept >= sweep_every) {
      DropIdleJobsMemory();
      swept = absl::Now();
    }
  }
}

std::vector<std::string> CheckpointService::ServedJobs() const {
  std::vector<std::string> jobs;
  for (const auto& [job, a] : activity_.All()) {
    if (a.sessions > 0) jobs.push_back(job);
  }
  return jobs;
}

void CheckpointService::NoteHungTrainers() {
  const absl::Time now = absl::Now();
  for (const HangWatch::Hung& h : hangs_.Check(now)) {
    std::string detail = absl::StrCat(
        "rank ", h.rank, " (pid ", h.pid, ") began no save for ",
        absl::FormatDuration(absl::Trunc(h.silent, absl::Milliseconds(100))),
        " with its session open");
    if (h.interval > absl::ZeroDuration()) {
      absl::StrAppend(
          &detail, " (saves every ",
          absl::FormatDuration(absl::Trunc(h.interval, absl::Milliseconds(1))),
          ")");
    }
    CKPT_LOG_WARN("job {}: trainer {}", h.job, detail);
    // It hung at most one interval after its last save: the rest of its
    // silence the job did not train.
    failures_.Failed(h.job, "trainer_hung", detail, /*incident=*/true, now,
                     static_cast<int>(h.rank), absl::InfiniteFuture(),
                     std::max(absl::ZeroDuration(), h.silent - h.interval));
  }
}

absl::StatusOr<CheckpointService::MemoryDrop>
CheckpointService::DropMemoryCopies(const std::string& job, bool dry_run) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  RevoteIfRejoined();  // shards persisted while fenced look uncommitted
  absl::MutexLock gc(&gc_mu_);
  ASSIGN_OR_RETURN(std::vector<MemoryCopy> copies, MemoryCopies(job));
  MemoryDrop out;
  std::vector<Eviction> drop;
  for (MemoryCopy& c : copies) {
    if (c.kept.empty() && Pinned(c.shard)) c.kept = kPinned;
    if (!c.kept.empty()) {
      out.kept.push_back({c.shard, c.kept});
      continue;
    }
    drop.push_back({c.shard, EvictionReason::kOperator});
    out.dropped.push_back(c.shard);
  }
  if (!dry_run && !drop.empty()) Evict(drop);
  return out;
}

std::string CheckpointService::DescribeMemoryHolders() {
  absl::StatusOr<std::vector<MemoryCopy>> copies = MemoryCopies("");
  if (!copies.ok()) {
    return absl::StrCat("the catalog could not say what holds the memory: ",
                        copies.status().message());
  }
  std::map<std::tuple<std::string, uint64_t, uint32_t>, const MemoryCopy*>
      by_slot;
  for (const MemoryCopy& c : *copies) {
    by_slot[{c.shard.job(), c.shard.step(), c.shard.rank()}] = &c;
  }
  struct Held {
    int slots = 0;
    uint64_t bytes = 0;
    std::string error;  // the first persist error among them
  };
  std::map<std::tuple<std::string, uint64_t, std::string>, Held> held;
  for (const SlotInfo& slot : arena_->Slots()) {
    std::string why = "being allocated";
    std::string error;
    auto it = by_slot.find({slot.id.job, slot.id.step, slot.id.rank});
    if (it != by_slot.end()) {
      const MemoryCopy& c = *it->second;
      why = !c.kept.empty()   ? c.kept
            : Pinned(c.shard) ? std::string(kPinned)
                              : "safe on disk (all such copies would not "
                                "have made room)";
      error = c.shard.error();
    }
    Held& h = held[{slot.id.job, slot.id.step, why}];
    ++h.slots;
    h.bytes += slot.bytes;
    if (h.error.empty()) h.error = error;
  }
  if (held.empty()) return "no slot holds the budget now";
  std::vector<std::string> parts;
  for (const auto& [key, h] : held) {
    const auto& [job, step, why] = key;
    const JobActivity::Job a = activity_.Get(job);
    const std::string state =
        a.sessions > 0 ? absl::StrCat(a.sessions, " trainer(s) attached")
                       : "no trainer attached";
    parts.push_back(
        absl::StrCat("job ", job, " (", state, ") step ", step, ": ", h.slots,
                     " slot(s), ", MiB(h.bytes), ", ", why,
                     h.error.empty() ? "" : absl::StrCat(" (", h.error, ")")));
    if (parts.size() == 12 && held.size() > 13) {
      parts.push_back(absl::StrCat("and ", held.size() - 12, " more"));
      break;
    }
  }
  return absl::StrCat("held by: ", absl::StrJoin(parts, "; "));
}

}  // namespace ckpt::daemon
