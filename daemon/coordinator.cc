#include "daemon/coordinator.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "daemon/records.h"
#include "snapshot/names.h"

namespace ckpt::daemon {
namespace {

std::string Pad(uint64_t v, int width) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*" PRIu64, width, v);
  return buf;
}

}  // namespace

std::string StepPrefix(const std::string& job, uint64_t step) {
  return absl::StrCat("/ckpt/", job, "/steps/", Pad(step, 20), "/");
}
std::string VoteKey(const std::string& job, uint64_t step, uint32_t rank) {
  return absl::StrCat(StepPrefix(job, step), "votes/", Pad(rank, 10));
}
std::string CommitKey(const std::string& job, uint64_t step, proto::Tier tier) {
  return absl::StrCat(StepPrefix(job, step), "commit/", TierName(tier));
}
std::string LatestKey(const std::string& job, proto::Tier tier) {
  return absl::StrCat("/ckpt/", job, "/latest/", TierName(tier));
}

absl::Status ValidateVote(const std::string& job, uint64_t step, uint32_t rank,
                          uint32_t world_size,
                          const std::vector<proto::Tier>& tiers) {
  if (absl::Status s = snapshot::ValidateJobId(job); !s.ok()) return s;
  if (world_size == 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("vote of job ", job, " step ", step, ": rank ", rank,
                     " is outside world size ", world_size));
  }
  for (proto::Tier t : tiers) {
    if (t < proto::TIER_MEMORY || t > proto::TIER_SHARED) {
      return absl::InvalidArgumentError(
          absl::StrCat("vote of job ", job, " step ", step, " rank ", rank,
                       ": invalid tier ", static_cast<int>(t)));
    }
  }
  return absl::OkStatus();
}

size_t VotesReaching(const std::vector<proto::VoteRecord>& votes,
                     proto::Tier tier) {
  return std::count_if(votes.begin(), votes.end(), [tier](const auto& v) {
    return std::find(v.tiers().begin(), v.tiers().end(), tier) !=
           v.tiers().end();
  });
}

proto::CommitRecord NewCommitRecord(const std::string& job, uint64_t step,
                                    proto::Tier tier, uint32_t world_size) {
  proto::CommitRecord record;
  record.set_job(job);
  record.set_step(step);
  record.set_tier(tier);
  record.set_world_size(world_size);
  record.set_committed_unix_micros(NowMicros());
  return record;
}

std::string RollbackKey(const std::string& job, int64_t unix_micros) {
  return absl::StrCat("/ckpt/", job, "/rollbacks/",
                      Pad(static_cast<uint64_t>(unix_micros), 20));
}
std::string StepsPrefix(const std::string& job) {
  return absl::StrCat("/ckpt/", job, "/steps/");
}

std::string TierName(proto::Tier tier) {
  switch (tier) {
    case proto::TIER_MEMORY:
      return "memory";
    case proto::TIER_PEER:
      return "peer";
    case proto::TIER_LOCAL_DISK:
      return "local_disk";
    case proto::TIER_SHARED:
      return "shared";
    default:
      return absl::StrCat("tier", static_cast<int>(tier));
  }
}

absl::StatusOr<proto::Tier> ParseTier(absl::string_view name) {
  for (proto::Tier t : {proto::TIER_MEMORY, proto::TIER_PEER,
                        proto::TIER_LOCAL_DISK, proto::TIER_SHARED}) {
    if (name == TierName(t)) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tier \"", name,
                   "\"; expected memory, peer, local_disk or shared"));
}

}  // namespace ckpt::daemon
