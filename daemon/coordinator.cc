#include "daemon/coordinator.h"

#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"

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
