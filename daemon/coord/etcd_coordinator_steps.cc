// EtcdCoordinator: votes and commit records (Vote, the commit queries,
// WithdrawVote, ForgetStep, RollBack). See etcd_coordinator.h.
#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/records.h"
#include "daemon/coord/etcd_coordinator.h"
#include "daemon/coord/etcd_ops.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {

using etcd_ops::Compare;
using etcd_ops::CreatedNever;
using etcd_ops::kAttempts;
using etcd_ops::ModifiedAt;
using etcd_ops::PrefixEnd;
using etcd_ops::PutOp;

namespace {

// The votes' index (coordinator.h) is counted, never read.
etcdserverpb::RequestOp CountOp(const std::string& prefix) {
  etcdserverpb::RequestOp op;
  auto* range = op.mutable_request_range();
  range->set_key(prefix);
  range->set_range_end(PrefixEnd(prefix));
  range->set_count_only(true);
  return op;
}

}  // namespace

absl::StatusOr<std::vector<proto::Tier>> EtcdCoordinator::Vote(
    const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
    const std::vector<proto::Tier>& tiers) {
  RETURN_IF_ERROR(ValidateVote(job, step, rank, world_size, tiers));
  VoteKind kind{job, step, world_size, tiers};
  std::sort(kind.tiers.begin(), kind.tiers.end());
  Queued mine;
  mine.rank = rank;
  absl::MutexLock lock(&votes_mu_);
  VoteQueue& queue = vote_queues_[kind];
  queue.waiting.push_back(&mine);
  // One thread per kind sends: it takes what queued up while its last
  // transaction was in flight, until nothing is left.
  while (!mine.done && queue.flushing) voted_.Wait(&votes_mu_);
  if (mine.done) return std::move(mine.result);
  queue.flushing = true;
  while (!queue.waiting.empty()) {
    std::vector<Queued*> batch;
    batch.swap(queue.waiting);
    std::vector<uint32_t> ranks;
    for (Queued* q : batch) ranks.push_back(q->rank);
    votes_mu_.Unlock();
    absl::StatusOr<std::vector<proto::Tier>> result =
        VoteMany(job, step, ranks, world_size, kind.tiers);
    votes_mu_.Lock();
    for (Queued* q : batch) {
      q->result = result;
      q->done = true;
    }
    voted_.SignalAll();
  }
  queue.flushing = false;
  vote_queues_.erase(kind);
  return std::move(mine.result);
}

absl::StatusOr<std::vector<proto::Tier>> EtcdCoordinator::VoteMany(
    const std::string& job, uint64_t step, const std::vector<uint32_t>& ranks,
    uint32_t world_size, const std::vector<proto::Tier>& tiers) {
  for (uint32_t rank : ranks) {
    RETURN_IF_ERROR(ValidateVote(job, step, rank, world_size, tiers));
  }
  // A rank twice (two votes of it queued together) is one vote: etcd refuses
  // a transaction that writes a key twice.
  const std::set<uint32_t> unique(ranks.begin(), ranks.end());
  const std::vector<uint32_t> all(unique.begin(), unique.end());
  std::vector<proto::Tier> committed;
  for (size_t at = 0; at < all.size(); at += kVoteBatch) {
    const std::vector<uint32_t> batch(
        all.begin() + at, all.begin() + std::min(all.size(), at + kVoteBatch));
    const std::string what =
        batch.size() == 1
            ? absl::StrCat("vote of job ", job, " step ", step, " rank ",
                           batch[0])
            : absl::StrCat("votes of job ", job, " step ", step, " ranks ",
                           batch.front(), "..", batch.back());
    const int64_t lease = lease_id();
    if (lease == 0) return FencedOr(lease, absl::OkStatus());
    ASSIGN_OR_RETURN(StepCounts counts, WriteVotes(job, step, batch, world_size,
                                                   tiers, lease, what));
    if (counts.worlds > 1) {
      RETURN_IF_ERROR(CheckOneWorld(job, step, world_size, what));
    }
    committed.clear();
    for (proto::Tier tier : kAllTiers) {
      // Votes are never taken back once a step is committed, so a tier not
      // every rank reached has no commit.
      if (counts.commits.count(CommitKey(job, step, tier)) == 0) {
        if (counts.reached[tier] < static_cast<int64_t>(world_size)) continue;
        RETURN_IF_ERROR(CommitTier(job, step, tier, world_size, lease, what));
      }
      committed.push_back(tier);
    }
  }
  return committed;
}

// The ranks' votes, each merged with what it voted before, and their index
// keys, written only while this node holds its lease; the same transaction
// counts the step's votes per tier after the writes, so of two racing voters
// the later one counts both.
absl::StatusOr<EtcdCoordinator::StepCounts> EtcdCoordinator::WriteVotes(
    const std::string& job, uint64_t step, const std::vector<uint32_t>& ranks,
    uint32_t world_size, const std::vector<proto::Tier>& tiers, int64_t lease,
    const std::string& what) {
  // This node is the only writer of its ranks' votes: what it wrote last
  // (and the revision it was written at) is remembered, so a vote is one
  // transaction. Without that memory (the first vote, a restart), the key is
  // assumed absent; a failed comparison then reads it and retries.
  std::map<std::string, std::pair<std::string, int64_t>> known;
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t rank : ranks) {
      auto it = my_votes_.find(VoteKey(job, step, rank));
      if (it != my_votes_.end()) known.insert(*it);
    }
  }
  for (int attempt = 0;; ++attempt) {
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = HoldsLease(lease);
    std::map<std::string, std::string> written;
    for (uint32_t rank : ranks) {
      const std::string key = VoteKey(job, step, rank);
      proto::VoteRecord mine;
      mine.set_rank(rank);
      mine.set_world_size(world_size);
      int64_t revision = 0;
      if (auto it = known.find(key); it != known.end()) {
        ASSIGN_OR_RETURN(mine,
                         ParseRecord<proto::VoteRecord>(key, it->second.first));
        revision = it->second.second;
      }
      std::set<int> merged(mine.tiers().begin(), mine.tiers().end());
      for (proto::Tier t : tiers) merged.insert(t);
      mine.clear_tiers();
      for (int t : merged) {
        mine.add_tiers(static_cast<proto::Tier>(t));
        *txn.add_success() =
            PutOp(ReachedKey(job, step, static_cast<proto::Tier>(t), rank), "");
      }
      *txn.add_compare() = ModifiedAt(key, revision);
      written[key] = mine.SerializeAsString();
      *txn.add_success() = PutOp(key, written[key]);
    }
    *txn.add_success() = PutOp(WorldKey(job, step, world_size), "");
    const int counted = txn.success_size();
    for (proto::Tier tier : kAllTiers) {
      *txn.add_success() = CountOp(ReachedPrefix(job, step, tier));
    }
    *txn.add_success() = CountOp(WorldsPrefix(job, step));
    const std::string commits_prefix = StepPrefix(job, step) + "commit/";
    auto* commits = txn.add_success()->mutable_request_range();
    commits->set_key(commits_prefix);
    commits->set_range_end(PrefixEnd(commits_prefix));
    commits->set_keys_only(true);
    ASSIGN_OR_RETURN(etcdserverpb::TxnResponse voted, Txn(txn, what));
    if (voted.succeeded()) {
      {
        absl::MutexLock lock(&mu_);
        if (my_votes_.size() > 100000) my_votes_.clear();  // bounded memory
        for (auto& [key, record] : written) {
          my_votes_[key] = {std::move(record), voted.header().revision()};
        }
      }
      StepCounts counts;
      int at = counted;
      for (proto::Tier tier : kAllTiers) {
        counts.reached[tier] = voted.responses(at++).response_range().count();
      }
      counts.worlds = voted.responses(at++).response_range().count();
      for (const etcdserverpb::KeyValue& kv :
           voted.responses(at).response_range().kvs()) {
        counts.commits.insert(kv.key());
      }
      return counts;
    }
    absl::Status why = FencedOr(lease, absl::AbortedError(absl::StrCat(
                                           what, ": the vote kept changing")));
    if (why.code() != absl::StatusCode::kAborted || attempt >= kAttempts) {
      return why;
    }
    known.clear();
    for (uint32_t rank : ranks) {
      const std::string key = VoteKey(job, step, rank);
      ASSIGN_OR_RETURN(etcdserverpb::RangeResponse old, Range(key, false));
      if (old.kvs_size() == 1) {
        known[key] = {old.kvs(0).value(), old.kvs(0).mod_revision()};
      }
    }
  }
}

// More than one world size was voted with (or one withdrawn vote's index
// stayed): the votes themselves say whether one differs.
absl::Status EtcdCoordinator::CheckOneWorld(const std::string& job,
                                            uint64_t step, uint32_t world_size,
                                            const std::string& what) {
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse votes,
                   Range(StepPrefix(job, step) + "votes/", true));
  for (const etcdserverpb::KeyValue& kv : votes.kvs()) {
    ASSIGN_OR_RETURN(proto::VoteRecord v,
                     ParseRecord<proto::VoteRecord>(kv.key(), kv.value()));
    if (v.world_size() != world_size) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " with world size ", world_size, ", but rank ",
                       v.rank(), " voted with world size ", v.world_size()));
    }
  }
  return absl::OkStatus();
}

// The commit record, created only if absent, with the tier's latest pointer
// moved forward in the same transaction, and only by a node holding its
// lease. OK too when another node committed it first.
absl::Status EtcdCoordinator::CommitTier(const std::string& job, uint64_t step,
                                         proto::Tier tier, uint32_t world_size,
                                         int64_t lease,
                                         const std::string& what) {
  const std::string commit_key = CommitKey(job, step, tier);
  const proto::CommitRecord record =
      NewCommitRecord(job, step, tier, world_size);
  const std::string latest_key = LatestKey(job, tier);
  for (int attempt = 0;; ++attempt) {
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse latest,
                     Range(latest_key, false));
    uint64_t latest_step = 0;
    int64_t latest_revision = 0;
    if (latest.kvs_size() == 1) {
      latest_revision = latest.kvs(0).mod_revision();
      if (!absl::SimpleAtoi(latest.kvs(0).value(), &latest_step)) {
        return absl::DataLossError(
            absl::StrCat("coordination record ", latest_key, " is not a step"));
      }
    }
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = HoldsLease(lease);
    *txn.add_compare() = CreatedNever(commit_key);
    *txn.add_compare() = ModifiedAt(latest_key, latest_revision);
    *txn.add_success() = PutOp(commit_key, record.SerializeAsString());
    if (latest.kvs_size() == 0 || latest_step < step) {
      *txn.add_success() = PutOp(latest_key, absl::StrCat(step));
    }
    ASSIGN_OR_RETURN(
        etcdserverpb::TxnResponse done,
        Txn(txn, absl::StrCat(what, ": committing at ", TierName(tier))));
    if (done.succeeded()) return absl::OkStatus();
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse c, Range(commit_key, false));
    if (c.kvs_size() == 1) return absl::OkStatus();  // another node's commit
    absl::Status why = FencedOr(lease, absl::AbortedError(absl::StrCat(
                                           what, ": the latest step of ",
                                           TierName(tier), " kept moving")));
    if (why.code() != absl::StatusCode::kAborted || attempt >= kAttempts) {
      return why;
    }
  }
}

absl::StatusOr<absl::optional<proto::CommitRecord>> EtcdCoordinator::GetCommit(
    const std::string& job, uint64_t step, proto::Tier tier) {
  const std::string key = CommitKey(job, step, tier);
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(key, false));
  if (r.kvs_size() == 0) return absl::optional<proto::CommitRecord>();
  ASSIGN_OR_RETURN(proto::CommitRecord record,
                   ParseRecord<proto::CommitRecord>(key, r.kvs(0).value()));
  return absl::optional<proto::CommitRecord>(std::move(record));
}

absl::StatusOr<absl::optional<uint64_t>> EtcdCoordinator::LatestCommitted(
    const std::string& job, proto::Tier tier) {
  const std::string key = LatestKey(job, tier);
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(key, false));
  if (r.kvs_size() == 0) return absl::optional<uint64_t>();
  uint64_t step = 0;
  if (!absl::SimpleAtoi(r.kvs(0).value(), &step)) {
    return absl::DataLossError(
        absl::StrCat("coordination record ", key, " is not a step"));
  }
  return absl::optional<uint64_t>(step);
}

absl::StatusOr<std::vector<proto::CommitRecord>> EtcdCoordinator::ListCommits(
    const std::string& job) {
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r,
                   Range(absl::StrCat("/ckpt/", job, "/steps/"), true));
  std::vector<proto::CommitRecord> out;
  for (const etcdserverpb::KeyValue& kv : r.kvs()) {
    if (kv.key().find("/commit/") == std::string::npos) continue;
    ASSIGN_OR_RETURN(proto::CommitRecord record,
                     ParseRecord<proto::CommitRecord>(kv.key(), kv.value()));
    out.push_back(std::move(record));
  }
  return out;
}

absl::StatusOr<std::set<uint64_t>> EtcdCoordinator::StepsVotedAt(
    const std::string& job, proto::Tier tier, uint64_t after) {
  // The steps after `after` only: a replicator asks about its backlog.
  etcdserverpb::RangeRequest req;
  req.set_key(StepPrefix(job, after + 1));
  req.set_range_end(PrefixEnd(StepsPrefix(job)));
  etcdserverpb::RangeResponse r;
  grpc::ClientContext context;
  RETURN_IF_ERROR(Checked(kv_->Range(Prepare(&context), req, &r),
                          absl::StrCat("reading the votes of job ", job)));
  std::set<uint64_t> out;
  for (const etcdserverpb::KeyValue& kv : r.kvs()) {
    uint64_t step = 0;
    if (kv.key().find("/votes/") == std::string::npos ||
        !StepOfKey(kv.key(), &step)) {
      continue;
    }
    ASSIGN_OR_RETURN(proto::VoteRecord vote,
                     ParseRecord<proto::VoteRecord>(kv.key(), kv.value()));
    for (int t : vote.tiers()) {
      if (t == tier) out.insert(step);
    }
  }
  return out;
}

absl::Status EtcdCoordinator::WithdrawVote(const std::string& job,
                                           uint64_t step, uint32_t rank) {
  const int64_t lease = lease_id();
  if (lease == 0) return FencedOr(lease, absl::OkStatus());
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = HoldsLease(lease);
  for (proto::Tier tier : kAllTiers) {
    *txn.add_compare() = CreatedNever(CommitKey(job, step, tier));
  }
  txn.add_success()->mutable_request_delete_range()->set_key(
      VoteKey(job, step, rank));
  for (proto::Tier tier : kAllTiers) {
    txn.add_success()->mutable_request_delete_range()->set_key(
        ReachedKey(job, step, tier, rank));
  }
  txn.add_success()->mutable_request_delete_range()->set_key(
      HolderKey(job, step, rank));
  // A commit record seen by the transaction may be gone by the time it is
  // looked for (garbage collection forgot the step meanwhile): try again.
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    ASSIGN_OR_RETURN(etcdserverpb::TxnResponse done,
                     Txn(txn, absl::StrCat("withdrawing the vote of job ", job,
                                           " step ", step, " rank ", rank)));
    if (done.succeeded()) return absl::OkStatus();
    for (proto::Tier tier : kAllTiers) {
      ASSIGN_OR_RETURN(auto commit, GetCommit(job, step, tier));
      if (commit.has_value()) {
        return absl::AlreadyExistsError(absl::StrCat(
            "job ", job, " step ", step, " is already committed at ",
            TierName(tier), "; a committed step is never replaced"));
      }
    }
    if (lease_id() != lease) break;  // fenced or rejoined meanwhile
  }
  return FencedOr(lease, absl::AbortedError("withdrawing a vote raced"));
}

absl::Status EtcdCoordinator::ForgetStep(const std::string& job,
                                         uint64_t step) {
  const int64_t lease = lease_id();
  if (lease == 0) return FencedOr(lease, absl::OkStatus());
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = HoldsLease(lease);
  for (proto::Tier tier : kAllTiers) {
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse latest,
                     Range(LatestKey(job, tier), false));
    if (latest.kvs_size() == 1 && latest.kvs(0).value() == absl::StrCat(step)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step, " of job ", job, " is the latest committed at tier ",
          TierName(tier), "; it is never dropped"));
    }
    // A commit of this step landing between the check and the delete (its
    // last replica verified meanwhile, say) would make it the latest: the
    // delete then fails instead of taking that commit along.
    *txn.add_compare() =
        latest.kvs_size() == 1
            ? ModifiedAt(LatestKey(job, tier), latest.kvs(0).mod_revision())
            : CreatedNever(LatestKey(job, tier));
  }
  auto* del = txn.add_success()->mutable_request_delete_range();
  del->set_key(StepPrefix(job, step));
  del->set_range_end(PrefixEnd(StepPrefix(job, step)));
  ASSIGN_OR_RETURN(
      etcdserverpb::TxnResponse done,
      Txn(txn, absl::StrCat("forgetting job ", job, " step ", step)));
  if (done.succeeded()) return absl::OkStatus();
  return FencedOr(lease, absl::AbortedError("forgetting a step raced"));
}

absl::Status EtcdCoordinator::RollBack(const std::string& job, uint64_t step,
                                       const proto::RollbackRecord& record) {
  const int64_t lease = lease_id();
  if (lease == 0) return FencedOr(lease, absl::OkStatus());
  const std::string prefix = StepsPrefix(job);
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse all, Range(prefix, true));
  std::map<proto::Tier, uint64_t> newest;  // per tier, among steps <= step
  for (const etcdserverpb::KeyValue& kv : all.kvs()) {
    if (kv.key().find("/commit/") == std::string::npos) continue;
    ASSIGN_OR_RETURN(proto::CommitRecord c,
                     ParseRecord<proto::CommitRecord>(kv.key(), kv.value()));
    if (c.step() <= step) {
      newest[c.tier()] = std::max(newest[c.tier()], c.step());
    }
  }
  // One transaction, guarded by the lease and by the revision the commits
  // were read at (no commit may land in between).
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = HoldsLease(lease);
  Compare unchanged;
  unchanged.set_key(prefix);
  unchanged.set_range_end(PrefixEnd(prefix));
  unchanged.set_target(Compare::MOD);
  unchanged.set_result(Compare::LESS);
  unchanged.set_mod_revision(all.header().revision() + 1);
  *txn.add_compare() = unchanged;
  auto* newer = txn.add_success()->mutable_request_delete_range();
  newer->set_key(StepPrefix(job, step + 1));
  newer->set_range_end(PrefixEnd(prefix));
  for (proto::Tier tier : kAllTiers) {
    auto it = newest.find(tier);
    if (it != newest.end()) {
      *txn.add_success() =
          PutOp(LatestKey(job, tier), absl::StrCat(it->second));
    } else {
      txn.add_success()->mutable_request_delete_range()->set_key(
          LatestKey(job, tier));
    }
  }
  *txn.add_success() =
      PutOp(RollbackKey(job, record.unix_micros()), record.SerializeAsString());
  ASSIGN_OR_RETURN(
      etcdserverpb::TxnResponse done,
      Txn(txn, absl::StrCat("rolling job ", job, " back to step ", step)));
  if (done.succeeded()) return absl::OkStatus();
  return FencedOr(lease, absl::AbortedError(absl::StrCat(
                             "rolling job ", job, " back to step ", step,
                             ": the job committed meanwhile; stop it first")));
}

}  // namespace ckpt::daemon
