#include "daemon/etcd_coordinator.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "daemon/records.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {
namespace {

using etcdserverpb::Compare;

constexpr int kAttempts = 20;  // transactions retried after losing a race

// The key range of every key that starts with `prefix`.
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

// The one conversion of etcd's gRPC statuses (the codes are the same numbers).
absl::Status EtcdError(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": etcd: ", s.error_message()));
}

Compare CreatedNever(const std::string& key) {
  Compare c;
  c.set_key(key);
  c.set_target(Compare::CREATE);
  c.set_result(Compare::EQUAL);
  c.set_create_revision(0);
  return c;
}

Compare ModifiedAt(const std::string& key, int64_t revision) {
  Compare c;
  c.set_key(key);
  c.set_target(Compare::MOD);
  c.set_result(Compare::EQUAL);
  c.set_mod_revision(revision);
  return c;
}

etcdserverpb::RequestOp PutOp(const std::string& key, std::string value) {
  etcdserverpb::RequestOp op;
  op.mutable_request_put()->set_key(key);
  op.mutable_request_put()->set_value(std::move(value));
  return op;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseEtcdUrl(absl::string_view url) {
  constexpr absl::string_view kScheme = "etcd://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator \"", url, "\" is not etcd://host:port[,host:port...]"));
  }
  std::vector<std::string> endpoints =
      absl::StrSplit(url.substr(kScheme.size()), ',', absl::SkipEmpty());
  if (endpoints.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator \"", url, "\" names no etcd endpoint"));
  }
  for (const std::string& e : endpoints) {
    std::pair<std::string, std::string> host_port = absl::StrSplit(e, ':');
    int port = 0;
    if (host_port.first.empty() || !absl::SimpleAtoi(host_port.second, &port) ||
        port <= 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "coordinator \"", url, "\": \"", e, "\" is not host:port"));
    }
  }
  return endpoints;
}

EtcdCoordinator::EtcdCoordinator(const EtcdOptions& options)
    : options_(options) {}

absl::StatusOr<std::unique_ptr<EtcdCoordinator>> EtcdCoordinator::Connect(
    const EtcdOptions& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("no etcd endpoint given");
  }
  RETURN_IF_ERROR(snapshot::ValidateJobId(options.node_id));
  if (options.lease_ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError("the etcd lease TTL must be >= 1 s");
  }
  std::unique_ptr<EtcdCoordinator> c(new EtcdCoordinator(options));
  const std::string target =
      options.endpoints.size() == 1
          ? options.endpoints[0]
          : absl::StrCat("ipv4:", absl::StrJoin(options.endpoints, ","));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  c->channel_ = grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args);
  c->kv_ = etcdserverpb::KV::NewStub(c->channel_);
  c->lease_stub_ = etcdserverpb::Lease::NewStub(c->channel_);
  c->watch_stub_ = etcdserverpb::Watch::NewStub(c->channel_);
  RETURN_IF_ERROR(c->Register());
  c->keep_alive_ = std::thread([p = c.get()] { p->KeepAliveLoop(); });
  CKPT_LOG_INFO("ckptd: node {} joined etcd at {} (lease {:x}, TTL {} s)",
                options.node_id, target, c->lease_id(),
                absl::ToInt64Seconds(options.lease_ttl));
  return c;
}

EtcdCoordinator::~EtcdCoordinator() {
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    lease = lease_;
  }
  if (keep_alive_.joinable()) keep_alive_.join();
  if (lease != 0) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(2));
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(lease);
    etcdserverpb::LeaseRevokeResponse resp;
    (void)lease_stub_->LeaseRevoke(&context, req, &resp);
  }
}

std::string EtcdCoordinator::MemberKey() const {
  return absl::StrCat("/ckpt/nodes/", options_.node_id);
}

void EtcdCoordinator::PauseKeepAliveForTesting(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_ = paused;
}

int64_t EtcdCoordinator::lease_id() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

grpc::ClientContext* EtcdCoordinator::Prepare(
    grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  return context;
}

absl::Status EtcdCoordinator::Register() {
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(absl::ToInt64Seconds(options_.lease_ttl));
  etcdserverpb::LeaseGrantResponse granted;
  grpc::ClientContext c1;
  RETURN_IF_ERROR(EtcdError(
      lease_stub_->LeaseGrant(Prepare(&c1), grant, &granted), "lease grant"));
  if (!granted.error().empty()) {
    return absl::UnavailableError("etcd lease grant: " + granted.error());
  }
  etcdserverpb::PutRequest put;
  put.set_key(MemberKey());
  put.set_value(options_.node_id);
  put.set_lease(granted.id());
  etcdserverpb::PutResponse put_resp;
  grpc::ClientContext c2;
  RETURN_IF_ERROR(EtcdError(kv_->Put(Prepare(&c2), put, &put_resp),
                            "registering node " + options_.node_id));
  absl::MutexLock lock(&mu_);
  lease_ = granted.id();
  return absl::OkStatus();
}

void EtcdCoordinator::KeepAliveLoop() {
  const absl::Duration period =
      std::max(absl::Milliseconds(200), options_.lease_ttl / 3);
  auto stopping = [this] {
    absl::MutexLock lock(&mu_);
    return stopping_;
  };
  // Sleeps `d` unless the coordinator stops first; false when it stops.
  auto nap = [this](absl::Duration d) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
    return !stopping_;
  };
  auto paused = [this] {
    absl::MutexLock lock(&mu_);
    return paused_;
  };
  while (!stopping()) {
    if (paused()) {
      if (!nap(absl::Milliseconds(50))) return;
      continue;
    }
    int64_t lease = lease_id();
    if (lease == 0) {
      absl::Status s = Register();
      if (!s.ok()) {
        if (!nap(absl::Milliseconds(500))) return;
        continue;
      }
      rejoins_++;
      CKPT_LOG_WARN("ckptd: node {} rejoined with a new etcd lease {:x}",
                    options_.node_id, lease_id());
      continue;
    }
    grpc::ClientContext context;
    auto stream = lease_stub_->LeaseKeepAlive(&context);
    while (true) {
      etcdserverpb::LeaseKeepAliveRequest req;
      req.set_id(lease);
      etcdserverpb::LeaseKeepAliveResponse resp;
      if (paused()) break;
      if (!stream->Write(req) || !stream->Read(&resp)) break;  // reconnect
      if (resp.ttl() <= 0) {
        // Expired while this process could not renew it (paused, or etcd
        // unreachable for longer than the TTL): fenced until it rejoins.
        absl::MutexLock lock(&mu_);
        if (lease_ == lease) lease_ = 0;
        CKPT_LOG_WARN("ckptd: node {} lost its etcd lease {:x}; fenced",
                      options_.node_id, lease);
        break;
      }
      if (!nap(period)) break;
    }
    context.TryCancel();
    (void)stream->Finish();
    if (!nap(absl::Milliseconds(200))) return;
  }
}

Compare EtcdCoordinator::HoldsLease(int64_t lease) const {
  Compare c;
  c.set_key(MemberKey());
  c.set_target(Compare::LEASE);
  c.set_result(Compare::EQUAL);
  c.set_lease(lease);
  return c;
}

absl::Status EtcdCoordinator::FencedOr(int64_t lease, absl::Status other) {
  auto member = Range(MemberKey(), false);
  if (!member.ok()) return member.status();
  if (member->kvs_size() == 1 && member->kvs(0).lease() == lease) return other;
  {
    absl::MutexLock lock(&mu_);
    if (lease_ == lease) lease_ = 0;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "node ", options_.node_id,
      " is fenced: its etcd lease expired (paused past its TTL of ",
      absl::ToInt64Seconds(options_.lease_ttl),
      " s?); it neither commits nor collects until it has rejoined"));
}

absl::StatusOr<etcdserverpb::RangeResponse> EtcdCoordinator::Range(
    const std::string& key, bool prefix) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  if (prefix) req.set_range_end(PrefixEnd(key));
  etcdserverpb::RangeResponse resp;
  grpc::ClientContext context;
  RETURN_IF_ERROR(EtcdError(kv_->Range(Prepare(&context), req, &resp),
                            absl::StrCat("reading ", key)));
  return resp;
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdCoordinator::Txn(
    const etcdserverpb::TxnRequest& request, const std::string& what) {
  etcdserverpb::TxnResponse resp;
  grpc::ClientContext context;
  RETURN_IF_ERROR(EtcdError(kv_->Txn(Prepare(&context), request, &resp), what));
  return resp;
}

absl::StatusOr<std::vector<proto::Tier>> EtcdCoordinator::Vote(
    const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
    const std::vector<proto::Tier>& tiers) {
  RETURN_IF_ERROR(ValidateVote(job, step, rank, world_size, tiers));
  const std::string what =
      absl::StrCat("vote of job ", job, " step ", step, " rank ", rank);
  const int64_t lease = lease_id();
  if (lease == 0) return FencedOr(lease, absl::OkStatus());

  // This rank's vote, merged with what it voted before, written only while
  // this node holds its lease; the same transaction reads every vote and
  // commit of the step after the write, so of two racing voters the later
  // one sees both votes.
  const std::string vote_key = VoteKey(job, step, rank);
  const std::string votes_prefix = StepPrefix(job, step) + "votes/";
  const std::string commits_prefix = StepPrefix(job, step) + "commit/";
  etcdserverpb::TxnResponse voted;
  // This node is the only writer of its ranks' votes: what it wrote last
  // (and the revision it was written at) is remembered, so a vote is one
  // transaction. Without that memory (the first vote, a restart), the key is
  // assumed absent; a failed comparison then reads it and retries.
  absl::optional<std::pair<std::string, int64_t>> known;
  {
    absl::MutexLock lock(&mu_);
    auto it = my_votes_.find(vote_key);
    if (it != my_votes_.end()) known = it->second;
  }
  for (int attempt = 0;; ++attempt) {
    proto::VoteRecord mine;
    mine.set_rank(rank);
    mine.set_world_size(world_size);
    int64_t revision = 0;
    if (known.has_value()) {
      ASSIGN_OR_RETURN(mine,
                       ParseRecord<proto::VoteRecord>(vote_key, known->first));
      revision = known->second;
    }
    std::set<int> merged(mine.tiers().begin(), mine.tiers().end());
    for (proto::Tier t : tiers) merged.insert(t);
    mine.clear_tiers();
    for (int t : merged) mine.add_tiers(static_cast<proto::Tier>(t));
    etcdserverpb::TxnRequest txn;
    *txn.add_compare() = HoldsLease(lease);
    *txn.add_compare() = ModifiedAt(vote_key, revision);
    *txn.add_success() = PutOp(vote_key, mine.SerializeAsString());
    for (const std::string* prefix : {&votes_prefix, &commits_prefix}) {
      auto* range = txn.add_success()->mutable_request_range();
      range->set_key(*prefix);
      range->set_range_end(PrefixEnd(*prefix));
    }
    ASSIGN_OR_RETURN(voted, Txn(txn, what));
    if (voted.succeeded()) {
      absl::MutexLock lock(&mu_);
      if (my_votes_.size() > 100000) my_votes_.clear();  // bounded memory
      my_votes_[vote_key] = {mine.SerializeAsString(),
                             voted.header().revision()};
      break;
    }
    absl::Status why = FencedOr(lease, absl::AbortedError(absl::StrCat(
                                           what, ": the vote kept changing")));
    if (why.code() != absl::StatusCode::kAborted || attempt >= kAttempts) {
      return why;
    }
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse old, Range(vote_key, false));
    known.reset();
    if (old.kvs_size() == 1) {
      known = std::make_pair(old.kvs(0).value(), old.kvs(0).mod_revision());
    }
  }
  std::vector<proto::VoteRecord> votes;
  for (const etcdserverpb::KeyValue& kv :
       voted.responses(1).response_range().kvs()) {
    ASSIGN_OR_RETURN(proto::VoteRecord v,
                     ParseRecord<proto::VoteRecord>(kv.key(), kv.value()));
    if (v.world_size() != world_size) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " with world size ", world_size, ", but rank ",
                       v.rank(), " voted with world size ", v.world_size()));
    }
    votes.push_back(std::move(v));
  }
  std::set<std::string> commits;
  for (const etcdserverpb::KeyValue& kv :
       voted.responses(2).response_range().kvs()) {
    commits.insert(kv.key());
  }
  std::vector<proto::Tier> committed;
  for (proto::Tier tier : kAllTiers) {
    const std::string commit_key = CommitKey(job, step, tier);
    if (commits.count(commit_key) > 0) {
      committed.push_back(tier);
      continue;
    }
    // Votes are never taken back once a step is committed, so a tier not
    // every rank reached has no commit.
    if (VotesReaching(votes, tier) < world_size) continue;
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
          return absl::DataLossError(absl::StrCat(
              "coordination record ", latest_key, " is not a step"));
        }
      }
      // Created only if absent, with the latest pointer moved forward in the
      // same transaction, and only by a node holding its lease.
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
      if (done.succeeded()) {
        committed.push_back(tier);
        break;
      }
      ASSIGN_OR_RETURN(etcdserverpb::RangeResponse c, Range(commit_key, false));
      if (c.kvs_size() == 1) {  // another node committed it first
        committed.push_back(tier);
        break;
      }
      absl::Status why = FencedOr(lease, absl::AbortedError(absl::StrCat(
                                             what, ": the latest step of ",
                                             TierName(tier), " kept moving")));
      if (why.code() != absl::StatusCode::kAborted || attempt >= kAttempts) {
        return why;
      }
    }
  }
  return committed;
}

absl::StatusOr<std::vector<std::string>> EtcdCoordinator::LiveNodes() {
  const std::string prefix = "/ckpt/nodes/";
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(prefix, true));
  std::vector<std::string> nodes;
  for (const etcdserverpb::KeyValue& kv : r.kvs()) {
    nodes.push_back(kv.key().substr(prefix.size()));
  }
  return nodes;
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
  ASSIGN_OR_RETURN(etcdserverpb::TxnResponse done,
                   Txn(txn, absl::StrCat("withdrawing the vote of job ", job,
                                         " step ", step, " rank ", rank)));
  if (done.succeeded()) return absl::OkStatus();
  for (proto::Tier tier : kAllTiers) {
    ASSIGN_OR_RETURN(auto commit, GetCommit(job, step, tier));
    if (commit.has_value()) {
      return absl::AlreadyExistsError(
          absl::StrCat("job ", job, " step ", step, " is already committed at ",
                       TierName(tier), "; a committed step is never replaced"));
    }
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

absl::StatusOr<Coordinator::Membership> EtcdCoordinator::WatchMembers(
    int64_t after_revision, absl::Duration timeout) {
  const std::string prefix = "/ckpt/nodes/";
  if (after_revision > 0) {
    // One watch from the revision after the caller's state: any event
    // (a node joining or leaving) ends the wait.
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    auto stream = watch_stub_->Watch(&context);
    etcdserverpb::WatchRequest req;
    auto* create = req.mutable_create_request();
    create->set_key(prefix);
    create->set_range_end(PrefixEnd(prefix));
    create->set_start_revision(after_revision + 1);
    if (stream->Write(req)) {
      etcdserverpb::WatchResponse resp;
      while (stream->Read(&resp)) {
        if (!resp.events().empty() || resp.canceled()) break;
      }
    }
    context.TryCancel();
    (void)stream->Finish();
  }
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(prefix, true));
  Membership m;
  m.revision = r.header().revision();
  for (const etcdserverpb::KeyValue& kv : r.kvs()) {
    m.nodes.push_back(kv.key().substr(prefix.size()));
  }
  return m;
}

absl::StatusOr<absl::optional<std::string>> EtcdCoordinator::StoreGet(
    const std::string& key) {
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(key, false));
  if (r.kvs_size() == 0) return absl::optional<std::string>();
  return absl::optional<std::string>(r.kvs(0).value());
}

absl::StatusOr<std::vector<std::string>> EtcdCoordinator::StoreKeys(
    const std::string& prefix) {
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(prefix, true));
  std::vector<std::string> keys;
  for (const etcdserverpb::KeyValue& kv : r.kvs()) {
    keys.push_back(kv.key().substr(prefix.size()));
  }
  return keys;
}

absl::Status EtcdCoordinator::StorePut(const std::string& key,
                                       const std::string& value,
                                       bool ephemeral) {
  // Ephemeral keys live on this node's lease: a participant whose daemon
  // died leaves the rendezvous with it.
  const int64_t lease = lease_id();
  if (lease == 0) return FencedOr(lease, absl::OkStatus());
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = HoldsLease(lease);
  *txn.add_success() = PutOp(key, value);
  if (ephemeral)
    txn.mutable_success(0)->mutable_request_put()->set_lease(lease);
  ASSIGN_OR_RETURN(etcdserverpb::TxnResponse done,
                   Txn(txn, absl::StrCat("writing ", key)));
  if (done.succeeded()) return absl::OkStatus();
  return FencedOr(lease, absl::AbortedError("writing " + key + " raced"));
}

absl::StatusOr<bool> EtcdCoordinator::StoreCreate(const std::string& key,
                                                  const std::string& value) {
  const int64_t lease = lease_id();
  if (lease == 0) return FencedOr(lease, absl::OkStatus());
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = HoldsLease(lease);
  *txn.add_compare() = CreatedNever(key);
  *txn.add_success() = PutOp(key, value);
  ASSIGN_OR_RETURN(etcdserverpb::TxnResponse done,
                   Txn(txn, absl::StrCat("creating ", key)));
  if (done.succeeded()) return true;
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(key, false));
  if (r.kvs_size() == 1) return false;
  return FencedOr(lease, absl::AbortedError("creating " + key + " raced"));
}

}  // namespace ckpt::daemon
