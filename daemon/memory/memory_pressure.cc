#include "daemon/memory/memory_pressure.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

absl::string_view ReasonName(EvictionReason reason) {
  switch (reason) {
    case EvictionReason::kIdleJob:
      return "idle_job";
    case EvictionReason::kOlderStep:
      return "older_step";
    case EvictionReason::kNewestStep:
      return "newest_step";
    case EvictionReason::kIdleTtl:
      return "idle_ttl";
    case EvictionReason::kOperator:
      return "operator";
  }
  return "unknown";
}

std::string WhyKept(const proto::ShardRecord& shard,
                    const std::set<uint64_t>& kept_elsewhere) {
  switch (shard.state()) {
    case proto::SHARD_STAGING:
      return "being staged";
    case proto::SHARD_STAGED:
      if (shard.persist_skipped()) return "";  // a newer save replaces it
      return shard.error().empty()
                 ? "being persisted"
                 : "its persist failed and is being tried again";
    case proto::SHARD_FAILED:
      return "its persist failed: the memory copy is the only one";
    case proto::SHARD_PERSISTED:
      break;
    default:
      return "in an unknown state";
  }
  if (!shard.shard_path().empty() || kept_elsewhere.count(shard.step()) > 0)
    return "";
  return "its shard file was retired: the memory copy is the last one here";
}

bool IsIdle(const JobActivity::Job& job, absl::Time now,
            absl::Duration recent) {
  if (job.sessions > 0) return false;
  return job.ever_attached || now - job.last_save > recent;
}

std::vector<Eviction> PlanEviction(const PressureInput& in, uint64_t needed) {
  if (needed == 0) return {};
  // The newest step per job among the copies that may go: what a restore of
  // that job would read from memory.
  std::map<std::string, uint64_t> newest;
  for (const MemoryCopy& c : in.copies) {
    if (!c.kept.empty()) continue;
    uint64_t& n = newest[c.shard.job()];
    n = std::max(n, c.shard.step());
  }
  struct Candidate {
    // Sorted by: class (0 idle job, 1 older step, 2 newest step of another
    // job, 3 the saving job's newest), then when last used, oldest first.
    std::tuple<int, absl::Time, int64_t, std::string, uint64_t, uint32_t> key;
    const MemoryCopy* copy;
    EvictionReason reason;
  };
  std::vector<Candidate> candidates;
  for (const MemoryCopy& c : in.copies) {
    if (!c.kept.empty()) continue;
    const proto::ShardRecord& s = c.shard;
    auto job = in.jobs.find(s.job());
    JobActivity::Job activity;  // not seen: idle since forever
    activity.last_save = activity.detached = absl::InfinitePast();
    if (job != in.jobs.end()) activity = job->second;
    int cls;
    EvictionReason reason;
    absl::Time last = absl::InfinitePast();
    if (s.job() != in.saving_job && IsIdle(activity, in.now, in.recent)) {
      cls = 0;
      reason = EvictionReason::kIdleJob;
      last = activity.LastActive(in.now);
    } else if (s.step() < newest[s.job()]) {
      cls = 1;
      reason = EvictionReason::kOlderStep;
    } else {
      cls = s.job() == in.saving_job ? 3 : 2;
      reason = EvictionReason::kNewestStep;
    }
    candidates.push_back(
        {{cls, last, s.staged_unix_micros(), s.job(), s.step(), s.rank()},
         &c,
         reason});
  }
  std::sort(
      candidates.begin(), candidates.end(),
      [](const Candidate& a, const Candidate& b) { return a.key < b.key; });
  std::vector<Eviction> out;
  uint64_t covered = 0;
  for (const Candidate& c : candidates) {
    if (covered >= needed) break;
    if (in.pinned && in.pinned(c.copy->shard)) continue;
    out.push_back({c.copy->shard, c.reason});
    covered += c.copy->shard.slot_bytes();
  }
  if (covered < needed) out.clear();
  return out;
}

}  // namespace ckpt::daemon
