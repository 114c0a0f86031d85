#include "daemon/coord/embedded_coordinator.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/records.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {

absl::StatusOr<std::vector<proto::Tier>> EmbeddedCoordinator::Vote(
    const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
    const std::vector<proto::Tier>& tiers) {
  RETURN_IF_ERROR(ValidateVote(job, step, rank, world_size, tiers));
  absl::MutexLock lock(&mu_);
  // Every rank's current vote for the step, with this one merged in.
  ASSIGN_OR_RETURN(auto existing,
                   store_->Scan(StepPrefix(job, step) + "votes/"));
  std::vector<proto::VoteRecord> votes;
  proto::VoteRecord mine;
  mine.set_rank(rank);
  mine.set_world_size(world_size);
  for (const auto& [key, bytes] : existing) {
    ASSIGN_OR_RETURN(proto::VoteRecord vote,
                     ParseRecord<proto::VoteRecord>(key, bytes));
    if (vote.world_size() != world_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "vote of job ", job, " step ", step, " rank ", rank,
          " with world size ", world_size, ", but rank ", vote.rank(),
          " voted with world size ", vote.world_size()));
    }
    if (vote.rank() == rank) {
      mine = vote;
    } else {
      votes.push_back(std::move(vote));
    }
  }
  std::set<int> merged(mine.tiers().begin(), mine.tiers().end());
  for (proto::Tier t : tiers) merged.insert(t);
  mine.clear_tiers();
  for (int t : merged) mine.add_tiers(static_cast<proto::Tier>(t));
  votes.push_back(mine);

  KvStore::Batch batch;
  batch.puts.emplace_back(VoteKey(job, step, rank), mine.SerializeAsString());
  std::vector<proto::Tier> committed;
  for (proto::Tier tier : kAllTiers) {
    ASSIGN_OR_RETURN(auto commit, store_->Get(CommitKey(job, step, tier)));
    if (commit.has_value()) {
      committed.push_back(tier);
      continue;
    }
    size_t reached = VotesReaching(votes, tier);
    if (reached < world_size) continue;
    const proto::CommitRecord record =
        NewCommitRecord(job, step, tier, world_size);
    batch.puts.emplace_back(CommitKey(job, step, tier),
                            record.SerializeAsString());
    ASSIGN_OR_RETURN(absl::optional<uint64_t> latest,
                     LatestCommitted(job, tier));
    if (!latest.has_value() || *latest < step) {
      batch.puts.emplace_back(LatestKey(job, tier), absl::StrCat(step));
    }
    committed.push_back(tier);
  }
  RETURN_IF_ERROR(store_->Write(batch));
  return committed;
}

absl::StatusOr<absl::optional<proto::CommitRecord>>
EmbeddedCoordinator::GetCommit(const std::string& job, uint64_t step,
                               proto::Tier tier) {
  std::string key = CommitKey(job, step, tier);
  ASSIGN_OR_RETURN(auto bytes, store_->Get(key));
  if (!bytes.has_value()) return absl::optional<proto::CommitRecord>();
  ASSIGN_OR_RETURN(proto::CommitRecord record,
                   ParseRecord<proto::CommitRecord>(key, *bytes));
  return absl::optional<proto::CommitRecord>(std::move(record));
}

absl::StatusOr<absl::optional<uint64_t>> EmbeddedCoordinator::LatestCommitted(
    const std::string& job, proto::Tier tier) {
  std::string key = LatestKey(job, tier);
  ASSIGN_OR_RETURN(auto bytes, store_->Get(key));
  if (!bytes.has_value()) return absl::optional<uint64_t>();
  uint64_t step = 0;
  if (!absl::SimpleAtoi(*bytes, &step)) {
    return absl::DataLossError(
        absl::StrCat("coordination record ", key, " is not a step"));
  }
  return absl::optional<uint64_t>(step);
}

absl::StatusOr<std::vector<proto::CommitRecord>>
EmbeddedCoordinator::ListCommits(const std::string& job) {
  ASSIGN_OR_RETURN(auto entries,
                   store_->Scan(absl::StrCat("/ckpt/", job, "/steps/")));
  std::vector<proto::CommitRecord> out;
  for (const auto& [key, bytes] : entries) {
    if (key.find("/commit/") == std::string::npos) continue;
    ASSIGN_OR_RETURN(proto::CommitRecord record,
                     ParseRecord<proto::CommitRecord>(key, bytes));
    out.push_back(std::move(record));
  }
  return out;
}

absl::StatusOr<std::set<uint64_t>> EmbeddedCoordinator::StepsVotedAt(
    const std::string& job, proto::Tier tier, uint64_t after) {
  ASSIGN_OR_RETURN(auto entries,
                   store_->Scan(absl::StrCat("/ckpt/", job, "/steps/")));
  std::set<uint64_t> out;
  for (const auto& [key, bytes] : entries) {
    const size_t votes = key.find("/votes/");
    if (votes == std::string::npos) continue;
    uint64_t step = 0;
    ASSIGN_OR_RETURN(proto::VoteRecord vote,
                     ParseRecord<proto::VoteRecord>(key, bytes));
    if (!StepOfKey(key, &step) || step <= after) continue;
    for (int t : vote.tiers()) {
      if (t == tier) out.insert(step);
    }
  }
  return out;
}

absl::Status EmbeddedCoordinator::WithdrawVote(const std::string& job,
                                               uint64_t step, uint32_t rank) {
  absl::MutexLock lock(&mu_);  // no vote can commit the step meanwhile
  for (proto::Tier tier : kAllTiers) {
    ASSIGN_OR_RETURN(auto commit, store_->Get(CommitKey(job, step, tier)));
    if (commit.has_value()) {
      return absl::AlreadyExistsError(
          absl::StrCat("job ", job, " step ", step, " is already committed at ",
                       TierName(tier), "; a committed step is never replaced"));
    }
  }
  KvStore::Batch batch;
  batch.deletes.push_back(VoteKey(job, step, rank));
  batch.deletes.push_back(HolderKey(job, step, rank));
  return store_->Write(batch);
}

absl::Status EmbeddedCoordinator::ForgetStep(const std::string& job,
                                             uint64_t step) {
  absl::MutexLock lock(&mu_);
  for (proto::Tier tier : kAllTiers) {
    ASSIGN_OR_RETURN(absl::optional<uint64_t> latest,
                     LatestCommitted(job, tier));
    if (latest.has_value() && *latest == step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step, " of job ", job, " is the latest committed at tier ",
          TierName(tier), "; it is never dropped"));
    }
  }
  ASSIGN_OR_RETURN(auto entries, store_->Scan(StepPrefix(job, step)));
  KvStore::Batch batch;
  for (const auto& [key, bytes] : entries) batch.deletes.push_back(key);
  return store_->Write(batch);
}

absl::Status EmbeddedCoordinator::RollBack(
    const std::string& job, uint64_t step,
    const proto::RollbackRecord& record) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(auto entries, store_->Scan(StepsPrefix(job)));
  KvStore::Batch batch;
  std::map<proto::Tier, uint64_t> newest;  // per tier, among steps <= step
  for (const auto& [key, bytes] : entries) {
    uint64_t s = 0;
    if (!absl::SimpleAtoi(key.substr(StepsPrefix(job).size(), 20), &s)) {
      return absl::DataLossError(absl::StrCat("coordination key ", key));
    }
    if (s > step) {
      batch.deletes.push_back(key);
    } else if (key.find("/commit/") != std::string::npos) {
      ASSIGN_OR_RETURN(proto::CommitRecord c,
                       ParseRecord<proto::CommitRecord>(key, bytes));
      newest[c.tier()] = std::max(newest[c.tier()], c.step());
    }
  }
  for (proto::Tier tier : kAllTiers) {
    auto it = newest.find(tier);
    if (it != newest.end()) {
      batch.puts.emplace_back(LatestKey(job, tier), absl::StrCat(it->second));
    } else {
      batch.deletes.push_back(LatestKey(job, tier));
    }
  }
  batch.puts.emplace_back(RollbackKey(job, record.unix_micros()),
                          record.SerializeAsString());
  return store_->Write(batch);
}

absl::StatusOr<Coordinator::Membership> EmbeddedCoordinator::WatchMembers(
    int64_t after_revision, absl::Duration timeout) {
  if (after_revision > 0) absl::SleepFor(timeout);
  return Membership{{node_id_}, 1};
}

absl::StatusOr<absl::optional<std::string>> EmbeddedCoordinator::StoreGet(
    const std::string& key) {
  return store_->Get(key);
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
EmbeddedCoordinator::StoreScan(const std::string& prefix) {
  ASSIGN_OR_RETURN(auto entries, store_->Scan(prefix));
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [key, value] : entries) {
    out.emplace_back(key.substr(prefix.size()), std::move(value));
  }
  return out;
}

absl::Status EmbeddedCoordinator::StorePut(const std::string& key,
                                           const std::string& value,
                                           bool ephemeral) {
  KvStore::Batch batch;
  batch.puts.emplace_back(key, value);
  return store_->Write(batch);
}

absl::Status EmbeddedCoordinator::StoreDelete(const std::string& key) {
  return store_->Delete(key);
}

absl::StatusOr<bool> EmbeddedCoordinator::StoreCreate(
    const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(auto existing, store_->Get(key));
  if (existing.has_value()) return false;
  RETURN_IF_ERROR(StorePut(key, value, false));
  return true;
}

}  // namespace ckpt::daemon
