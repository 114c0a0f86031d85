#include "daemon/coord/coordinator.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/records.h"
#include "io/logging.h"
#include "io/status_macros.h"
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
std::string ReachedPrefix(const std::string& job, uint64_t step,
                          proto::Tier tier) {
  return absl::StrCat(StepPrefix(job, step), "reached/", TierName(tier), "/");
}
std::string ReachedKey(const std::string& job, uint64_t step, proto::Tier tier,
                       uint32_t rank) {
  return ReachedPrefix(job, step, tier) + Pad(rank, 10);
}
std::string WorldsPrefix(const std::string& job, uint64_t step) {
  return StepPrefix(job, step) + "worlds/";
}
std::string WorldKey(const std::string& job, uint64_t step, uint32_t world) {
  return WorldsPrefix(job, step) + Pad(world, 10);
}
std::string HolderKey(const std::string& job, uint64_t step, uint32_t rank) {
  return absl::StrCat(StepPrefix(job, step), "parity/holders/", Pad(rank, 10));
}
std::string CommitKey(const std::string& job, uint64_t step, proto::Tier tier) {
  return absl::StrCat(StepPrefix(job, step), "commit/", TierName(tier));
}
std::string LatestKey(const std::string& job, proto::Tier tier) {
  return absl::StrCat("/ckpt/", job, "/latest/", TierName(tier));
}

absl::StatusOr<std::vector<proto::Tier>> Coordinator::VoteMany(
    const std::string& job, uint64_t step, const std::vector<uint32_t>& ranks,
    uint32_t world_size, const std::vector<proto::Tier>& tiers) {
  std::vector<proto::Tier> committed;
  for (uint32_t rank : ranks) {
    ASSIGN_OR_RETURN(committed, Vote(job, step, rank, world_size, tiers));
  }
  return committed;
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
bool StepOfKey(absl::string_view key, uint64_t* step) {
  constexpr absl::string_view kSteps = "/steps/";
  const size_t at = key.find(kSteps);
  if (at == absl::string_view::npos) return false;
  const absl::string_view digits = key.substr(at + kSteps.size(), 20);
  return digits.size() == 20 && absl::SimpleAtoi(digits, step);
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

absl::StatusOr<proto::EpochRecord> Coordinator::Rendezvous(
    const std::string& job, const std::string& participant,
    uint32_t min_members, uint32_t max_members, absl::Duration settle,
    absl::Duration timeout, proto::Tier resume_tier) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  RETURN_IF_ERROR(snapshot::ValidateJobId(participant));
  if (resume_tier == proto::TIER_UNSPECIFIED) resume_tier = proto::TIER_PEER;
  if (!proto::Tier_IsValid(resume_tier)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous of job ", job, ": unknown resume tier ",
                     static_cast<int>(resume_tier)));
  }
  if (min_members == 0 || max_members < min_members) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous of job ", job, ": bounds [", min_members, ", ",
                     max_members, "] are empty"));
  }
  const absl::Time deadline = absl::Now() + timeout;
  const std::string root = absl::StrCat("/ckpt/", job, "/epochs/");
  auto epoch_prefix = [&](uint64_t e) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%020" PRIu64 "/", e);
    return root + buf;
  };
  // The next epoch: one past the newest closed one.
  uint64_t epoch = 1;
  ASSIGN_OR_RETURN(absl::optional<std::string> current,
                   StoreGet(absl::StrCat("/ckpt/", job, "/epoch")));
  if (current.has_value() && !absl::SimpleAtoi(*current, &epoch)) {
    return absl::DataLossError("the job's epoch record is not a number");
  }
  if (current.has_value()) ++epoch;
  bool joined = false;
  size_t seen = 0;
  absl::Time changed = absl::Now();
  while (true) {
    const std::string prefix = epoch_prefix(epoch);
    ASSIGN_OR_RETURN(absl::optional<std::string> closed,
                     StoreGet(prefix + "closed"));
    if (closed.has_value()) {
      ASSIGN_OR_RETURN(
          proto::EpochRecord record,
          ParseRecord<proto::EpochRecord>(prefix + "closed", *closed));
      if (std::find(record.members().begin(), record.members().end(),
                    participant) != record.members().end()) {
        return record;
      }
      ++epoch;  // closed without us: the next one
      joined = false;
      seen = 0;
      changed = absl::Now();
      continue;
    }
    if (!joined) {
      RETURN_IF_ERROR(
          StorePut(prefix + "join/" + participant, participant, true));
      joined = true;
    }
    ASSIGN_OR_RETURN(std::vector<std::string> members,
                     StoreKeys(prefix + "join/"));
    if (members.size() != seen) {
      seen = members.size();
      changed = absl::Now();
    }
    if (members.size() >= max_members ||
        (members.size() >= min_members && absl::Now() - changed >= settle)) {
      std::sort(members.begin(), members.end());
      if (members.size() > max_members) members.resize(max_members);
      proto::EpochRecord record;
      record.set_epoch(epoch);
      for (const std::string& m : members) record.add_members(m);
      std::string id(128, '\0');
      std::random_device random;
      for (char& c : id) c = static_cast<char>(random());
      record.set_unique_id(id);
      record.set_closed_unix_micros(NowMicros());
      ASSIGN_OR_RETURN(absl::optional<uint64_t> resume,
                       LatestTrusted(job, resume_tier));
      record.set_resume_tier(resume_tier);
      record.set_has_resume_step(resume.has_value());
      if (resume.has_value()) record.set_resume_step(*resume);
      ASSIGN_OR_RETURN(bool created, StoreCreate(prefix + "closed",
                                                 record.SerializeAsString()));
      if (created) {
        RETURN_IF_ERROR(StorePut(absl::StrCat("/ckpt/", job, "/epoch"),
                                 absl::StrCat(epoch), false));
      }
      continue;  // read the decision back, whoever made it
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous of job ", job, " epoch ", epoch, ": ", members.size(),
          " of at least ", min_members, " participants joined"));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::StatusOr<absl::optional<uint64_t>> Coordinator::ResumeStep(
    const std::string& job) {
  ASSIGN_OR_RETURN(absl::optional<std::string> current,
                   StoreGet(absl::StrCat("/ckpt/", job, "/epoch")));
  uint64_t epoch = 0;
  if (!current.has_value()) return absl::optional<uint64_t>();
  if (!absl::SimpleAtoi(*current, &epoch)) {
    return absl::DataLossError("the job's epoch record is not a number");
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%020" PRIu64 "/closed", epoch);
  const std::string key = absl::StrCat("/ckpt/", job, "/epochs/", buf);
  ASSIGN_OR_RETURN(absl::optional<std::string> closed, StoreGet(key));
  if (!closed.has_value()) return absl::optional<uint64_t>();
  ASSIGN_OR_RETURN(proto::EpochRecord record,
                   ParseRecord<proto::EpochRecord>(key, *closed));
  if (!record.has_resume_step()) return absl::optional<uint64_t>();
  return absl::optional<uint64_t>(record.resume_step());
}

namespace {
constexpr char kPeersPrefix[] = "/ckpt/peers/";
}  // namespace

absl::StatusOr<std::vector<Coordinator::MemberChange>>
Coordinator::WatchMemberChanges(int64_t* /*revision*/,
                                absl::Duration /*timeout*/) {
  return absl::UnimplementedError(
      "this coordinator has one node: no membership changes to watch");
}

absl::Status Coordinator::SetServedJobs(
    const std::vector<std::string>& /*jobs*/) {
  return absl::OkStatus();
}

namespace {
constexpr char kDeparturesPrefix[] = "/ckpt/cluster/departures/";
}  // namespace

absl::StatusOr<bool> Coordinator::ClaimDeparture(const std::string& node,
                                                 int64_t lease,
                                                 const std::string& claimer) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(node));
  return StoreCreate(absl::StrCat(kDeparturesPrefix, node, "/",
                                  absl::Hex(lease, absl::kZeroPad16)),
                     claimer);
}

absl::Status Coordinator::ForgetDepartures(const std::string& node) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(node));
  const std::string prefix = absl::StrCat(kDeparturesPrefix, node, "/");
  ASSIGN_OR_RETURN(std::vector<std::string> keys, StoreKeys(prefix));
  for (const std::string& key : keys)
    RETURN_IF_ERROR(StoreDelete(prefix + key));
  return absl::OkStatus();
}

absl::Status Coordinator::PublishPeer(const proto::PeerInfo& info) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(info.node_id()));
  if (info.address().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", info.node_id(), " publishes no peer address"));
  }
  return StorePut(kPeersPrefix + info.node_id(), info.SerializeAsString(),
                  /*ephemeral=*/true);
}

absl::StatusOr<std::vector<proto::PeerInfo>> Coordinator::ListPeers() {
  ASSIGN_OR_RETURN(auto entries, StoreScan(kPeersPrefix));
  std::vector<proto::PeerInfo> peers;
  for (const auto& [node, value] : entries) {
    proto::PeerInfo info;
    if (!info.ParseFromString(value) || info.node_id() != node) {
      return absl::DataLossError(
          absl::StrCat("the peer record of node ", node, " is damaged"));
    }
    peers.push_back(std::move(info));
  }
  return peers;
}

absl::StatusOr<std::vector<std::string>> Coordinator::StoreKeys(
    const std::string& prefix) {
  ASSIGN_OR_RETURN(auto entries, StoreScan(prefix));
  std::vector<std::string> keys;
  for (auto& [key, value] : entries) keys.push_back(std::move(key));
  return keys;
}

absl::StatusOr<std::set<uint64_t>> Coordinator::StepsVotedBy(
    const std::string& job, uint32_t rank, uint64_t after) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  ASSIGN_OR_RETURN(std::vector<std::string> keys, StoreKeys(StepsPrefix(job)));
  // Keys under the prefix: "<step:020>/votes/<rank:010>".
  const std::string vote = absl::StrCat("/votes/", Pad(rank, 10));
  std::set<uint64_t> steps;
  for (const std::string& key : keys) {
    uint64_t step = 0;
    if (!absl::EndsWith(key, vote) ||
        !absl::SimpleAtoi(absl::string_view(key).substr(0, 20), &step)) {
      continue;
    }
    if (step > after) steps.insert(step);
  }
  return steps;
}

namespace {

std::string ParityPrefix(const std::string& job, uint64_t step) {
  return StepPrefix(job, step) + "parity/";
}

}  // namespace

absl::Status Coordinator::PublishShardHolder(const std::string& job,
                                             uint64_t step,
                                             const proto::ShardHolder& holder) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  return StorePut(HolderKey(job, step, holder.rank()),
                  holder.SerializeAsString(), /*ephemeral=*/false);
}

absl::StatusOr<std::vector<proto::ShardHolder>> Coordinator::ListShardHolders(
    const std::string& job, uint64_t step) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  const std::string prefix = ParityPrefix(job, step) + "holders/";
  ASSIGN_OR_RETURN(auto entries, StoreScan(prefix));
  std::vector<proto::ShardHolder> holders;
  for (const auto& [key, bytes] : entries) {
    ASSIGN_OR_RETURN(proto::ShardHolder h,
                     ParseRecord<proto::ShardHolder>(prefix + key, bytes));
    holders.push_back(std::move(h));
  }
  return holders;
}

absl::StatusOr<proto::ParityPlan> Coordinator::SettleParityPlan(
    const proto::ParityPlan& plan) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(plan.job()));
  const std::string key = ParityPrefix(plan.job(), plan.step()) + "plan";
  ASSIGN_OR_RETURN(bool created, StoreCreate(key, plan.SerializeAsString()));
  if (created) return plan;
  ASSIGN_OR_RETURN(absl::optional<proto::ParityPlan> kept,
                   GetParityPlan(plan.job(), plan.step()));
  if (!kept.has_value()) {
    return absl::UnavailableError(absl::StrCat(
        "the parity plan of job ", plan.job(), " step ", plan.step(),
        " was neither kept nor found (its step was dropped meanwhile?)"));
  }
  return *std::move(kept);
}

absl::StatusOr<absl::optional<proto::ParityPlan>> Coordinator::GetParityPlan(
    const std::string& job, uint64_t step) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  const std::string key = ParityPrefix(job, step) + "plan";
  ASSIGN_OR_RETURN(absl::optional<std::string> bytes, StoreGet(key));
  if (!bytes.has_value()) return absl::optional<proto::ParityPlan>();
  ASSIGN_OR_RETURN(proto::ParityPlan plan,
                   ParseRecord<proto::ParityPlan>(key, *bytes));
  return absl::optional<proto::ParityPlan>(std::move(plan));
}

absl::StatusOr<std::vector<proto::ParityPlan>> Coordinator::ListParityPlans() {
  ASSIGN_OR_RETURN(auto entries, StoreScan("/ckpt/"));
  std::vector<proto::ParityPlan> plans;
  for (const auto& [key, bytes] : entries) {
    if (!absl::EndsWith(key, "/parity/plan")) continue;
    ASSIGN_OR_RETURN(proto::ParityPlan plan,
                     ParseRecord<proto::ParityPlan>("/ckpt/" + key, bytes));
    plans.push_back(std::move(plan));
  }
  return plans;
}

namespace {

constexpr char kClusterKeyKey[] = "/ckpt/cluster/seal-key";

}  // namespace

absl::StatusOr<proto::ClusterKeyRecord> Coordinator::AgreeClusterKey(
    const std::string& fresh_key, const std::string& node) {
  ASSIGN_OR_RETURN(absl::optional<proto::ClusterKeyRecord> kept,
                   GetClusterKey());
  if (kept.has_value()) return *std::move(kept);
  proto::ClusterKeyRecord fresh;
  fresh.set_key(fresh_key);
  fresh.set_created_unix_micros(absl::ToUnixMicros(absl::Now()));
  fresh.set_created_by(node);
  ASSIGN_OR_RETURN(auto newest, NewestStepOfEachJob());
  fresh.mutable_unsealed_through()->insert(newest.begin(), newest.end());
  ASSIGN_OR_RETURN(bool created,
                   StoreCreate(kClusterKeyKey, fresh.SerializeAsString()));
  if (created) return fresh;
  ASSIGN_OR_RETURN(kept, GetClusterKey());  // another node's, kept first
  if (!kept.has_value()) {
    return absl::UnavailableError(
        absl::StrCat(kClusterKeyKey, " was neither kept nor found; try again"));
  }
  return *std::move(kept);
}

absl::StatusOr<absl::optional<proto::ClusterKeyRecord>>
Coordinator::GetClusterKey() {
  ASSIGN_OR_RETURN(absl::optional<std::string> bytes, StoreGet(kClusterKeyKey));
  if (!bytes.has_value()) return absl::optional<proto::ClusterKeyRecord>();
  ASSIGN_OR_RETURN(
      proto::ClusterKeyRecord kept,
      ParseRecord<proto::ClusterKeyRecord>(kClusterKeyKey, *bytes));
  if (kept.key().size() < 32) {
    return absl::DataLossError(absl::StrCat(
        kClusterKeyKey, " holds a key of ", kept.key().size(),
        " bytes; at least 32 are needed (deleting it makes a new key, and "
        "shards sealed under the old one unreadable)"));
  }
  return absl::optional<proto::ClusterKeyRecord>(std::move(kept));
}

absl::StatusOr<std::map<std::string, uint64_t>>
Coordinator::NewestStepOfEachJob() {
  ASSIGN_OR_RETURN(std::vector<std::string> keys, StoreKeys("/ckpt/"));
  std::map<std::string, uint64_t> newest;
  for (const std::string& key : keys) {
    // <job>/steps/<step:020>/...
    const size_t at = key.find("/steps/");
    uint64_t step = 0;
    if (at == std::string::npos ||
        !absl::SimpleAtoi(absl::string_view(key).substr(at + 7, 20), &step)) {
      continue;
    }
    uint64_t& n = newest[key.substr(0, at)];
    n = std::max(n, step);
  }
  return newest;
}

absl::StatusOr<std::shared_ptr<const snapshot::SealKeys>> SealKeysOf(
    const proto::ClusterKeyRecord& record) {
  return snapshot::SealKeys::FromBytes(
      record.key(), {},
      snapshot::SealKeys::UnsealedThrough(record.unsealed_through().begin(),
                                          record.unsealed_through().end()));
}

}  // namespace ckpt::daemon
