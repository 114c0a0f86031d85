// ParityTier: protecting this node's shards (publishing holders, settling the
// plan, pushing contributions, waiting for the group's parity).
#include "daemon/peer/parity_tier.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/common/describe.h"
#include "daemon/common/grpc_status.h"
#include "daemon/peer/parity_plan.h"
#include "daemon/peer/peer_fetch.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/peer.grpc.pb.h"
#include "snapshot/self_contained.h"
#include "snapshot/xxh3.h"

namespace ckpt::daemon {
namespace {

// Contributions are computed and sent this much of the shard at a time.
constexpr size_t kSegmentBytes = 1 << 20;
// While a group waits for its other data nodes, it is looked at this often
// (then every retry_interval).
constexpr absl::Duration kQuickPoll = absl::Milliseconds(100);
constexpr int kQuickPolls = 100;

bool HasPosition(const proto::ParityBlockRecord& r, uint32_t position) {
  for (const proto::ParityContribution& c : r.contributions()) {
    if (c.position() == position) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParityTier>> ParityTier::Start(
    io::FileSystem* fs, ParityOptions options, Coordinator* coordinator,
    Metrics* metrics, ChannelTo channel_to, LocalShardFile local_file,
    OnProtected on_protected) {
  ASSIGN_OR_RETURN(snapshot::ErasureCode code,
                   snapshot::ErasureCode::Create(options.k, options.m));
  std::unique_ptr<ParityTier> tier(new ParityTier(
      fs, std::move(options), std::move(code), coordinator, metrics,
      std::move(channel_to), std::move(local_file), std::move(on_protected)));
  ASSIGN_OR_RETURN(
      tier->store_,
      ParityStore::Open(fs, tier->options_.dir, tier->options_.budget_bytes));
  using T = Metrics::Type;
  metrics->Declare("ckpt_parity_bytes", T::kGauge,
                   "bytes of parity blocks this node holds for its peers");
  metrics->Declare("ckpt_parity_pending_shards", T::kGauge,
                   "persisted shards whose group's parity is not complete");
  metrics->Declare("ckpt_parity_sent_bytes_total", T::kCounter,
                   "parity contributions sent to parity holders and verified");
  metrics->Declare("ckpt_parity_encode_seconds_total", T::kCounter,
                   "time spent reading, encoding and sending them");
  metrics->Declare("ckpt_parity_rebuilt_bytes_total", T::kCounter,
                   "shard-file bytes decoded from parity groups for restores");
  metrics->Declare("ckpt_parity_rebuild_seconds_total", T::kCounter,
                   "time spent fetching the groups' blocks and decoding");
  metrics->Declare("ckpt_parity_reprotected_total", T::kCounter,
                   "shards whose group's parity was made again after a loss");
  metrics->Declare("ckpt_parity_reprotect_seconds_total", T::kCounter,
                   "time from the loss being seen to the parity made again");
  metrics->Declare("ckpt_parity_stand_in_shards_total", T::kCounter,
                   "lost data shards rebuilt ahead of restores and kept here "
                   "in their node's place");
  ParityTier* self = tier.get();
  metrics->OnScrape([self](Metrics& m) {
    m.Set("ckpt_parity_bytes", {},
          static_cast<double>(self->store_->used_bytes()));
    m.Set("ckpt_parity_pending_shards", {},
          static_cast<double>(self->pending()));
  });
  tier->thread_ = std::thread([t = tier.get()] { t->Loop(); });
  tier->repairer_ = std::thread([t = tier.get()] { t->RepairLoop(); });
  return tier;
}

ParityTier::ParityTier(io::FileSystem* fs, ParityOptions options,
                       snapshot::ErasureCode code, Coordinator* coordinator,
                       Metrics* metrics, ChannelTo channel_to,
                       LocalShardFile local_file, OnProtected on_protected)
    : fs_(fs),
      options_(std::move(options)),
      code_(std::move(code)),
      coordinator_(coordinator),
      metrics_(metrics),
      channel_to_(std::move(channel_to)),
      local_file_(std::move(local_file)),
      on_protected_(std::move(on_protected)) {}

ParityTier::~ParityTier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (repairer_.joinable()) repairer_.join();
}

void ParityTier::Enqueue(const proto::ShardRecord& shard, bool again) {
  absl::MutexLock lock(&mu_);
  Pending fresh;
  fresh.shard = shard;
  fresh.again = again;
  fresh.since = absl::Now();
  for (Pending& p : pending_) {
    if (p.shard.job() == shard.job() && p.shard.step() == shard.step() &&
        p.shard.rank() == shard.rank()) {
      // Saved again: published again. Still waiting for its first vote: it
      // keeps waiting for it.
      fresh.again = again && p.again;
      p = std::move(fresh);
      wake_ = true;
      return;
    }
  }
  pending_.push_back(std::move(fresh));
  wake_ = true;
}

size_t ParityTier::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

void ParityTier::Loop() {
  absl::Duration wait = options_.retry_interval;
  while (true) {
    std::vector<Pending> work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || wake_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
      if (stopping_) return;
      wake_ = false;
      work.swap(pending_);
    }
    std::vector<Pending> left;
    bool quick = false;
    for (Pending& p : work) {
      if (Protect(p)) continue;
      // Every pending shard counts its rounds (its warnings are every 50th).
      ++p.attempts;
      quick = quick || p.attempts < kQuickPolls;
      left.push_back(std::move(p));
    }
    wait = quick ? kQuickPoll : options_.retry_interval;
    absl::MutexLock lock(&mu_);
    // Enqueued meanwhile (a newer save of the same shard) wins.
    for (Pending& p : left) {
      bool newer = false;
      for (const Pending& q : pending_) {
        newer = newer || (q.shard.job() == p.shard.job() &&
                          q.shard.step() == p.shard.step() &&
                          q.shard.rank() == p.shard.rank());
      }
      if (!newer) pending_.push_back(std::move(p));
    }
  }
}

absl::StatusOr<absl::optional<proto::ParityPlan>> ParityTier::PlanOf(
    const proto::ShardRecord& shard) {
  ASSIGN_OR_RETURN(absl::optional<proto::ParityPlan> plan,
                   coordinator_->GetParityPlan(shard.job(), shard.step()));
  if (plan.has_value()) return plan;
  ASSIGN_OR_RETURN(std::vector<proto::ShardHolder> holders,
                   coordinator_->ListShardHolders(shard.job(), shard.step()));
  if (holders.size() < shard.world_size()) {
    return absl::optional<proto::ParityPlan>();  // not every rank yet
  }
  ASSIGN_OR_RETURN(std::vector<proto::PeerInfo> nodes,
                   coordinator_->ListPeers());
  ASSIGN_OR_RETURN(proto::ParityPlan made,
                   PlanParity(shard.job(), shard.step(), code_.k(), code_.m(),
                              shard.world_size(), holders, nodes));
  made.set_planned_by(options_.node_id);
  ASSIGN_OR_RETURN(proto::ParityPlan kept,
                   coordinator_->SettleParityPlan(made));
  if (kept.planned_by() == options_.node_id) {
    CKPT_LOG_INFO(
        "job {} step {}: parity plan {} made: {} groups, {} bytes "
        "of parity",
        shard.job(), shard.step(), code_.ToString(), kept.groups_size(),
        ParityBytes(kept));
  }
  return absl::optional<proto::ParityPlan>(std::move(kept));
}

bool ParityTier::Protect(Pending& p) {
  const proto::ShardRecord& shard = p.shard;
  const std::string what = Describe(shard.job(), shard.step(), shard.rank());
  // Said once, and then every 50 rounds.
  auto note = [&](const std::string& why) {
    if (p.attempts % 50 == 0) {
      CKPT_LOG_WARN("{}: parity not in place yet: {}", what, why);
    }
  };
  // Its file gone (retention dropped its step, or it was saved again and
  // replaced): nothing is left to protect, and it is not looked at again.
  if (!fs_->Exists(shard.shard_path()).value_or(true)) {
    CKPT_LOG_INFO("{}: its shard file is gone; no parity for it", what);
    return true;
  }
  if (!p.published) {
    absl::StatusOr<snapshot::SelfContained> view =
        snapshot::OpenSelfContained(fs_, shard.shard_path());
    if (!view.ok()) {
      CKPT_LOG_WARN("{}: cannot protect it with parity: {}", what,
                    view.status().ToString());
      return true;  // its file is gone (collected, or saved again)
    }
    p.holder.set_rank(shard.rank());
    p.holder.set_node(options_.node_id);
    p.holder.set_failure_domain(options_.failure_domain);
    p.holder.set_file_bytes(view->size);
    p.holder.set_manifest_xxh3(
        XXH3_64bits(view->manifest_bytes.data(), view->manifest_bytes.size()));
    absl::Status published =
        coordinator_->PublishShardHolder(shard.job(), shard.step(), p.holder);
    if (!published.ok()) {
      note(published.ToString());
      return false;
    }
    p.published = true;
  }
  absl::StatusOr<absl::optional<proto::ParityPlan>> plan = PlanOf(shard);
  if (!plan.ok()) {
    note(plan.status().ToString());
    return false;
  }
  if (!plan->has_value()) return false;  // other ranks have not persisted
  absl::StatusOr<ParityPosition> at = FindInPlan(**plan, shard.rank());
  if (!at.ok()) {
    CKPT_LOG_ERROR("{}: {}", what, at.status().ToString());
    return true;
  }
  const proto::ParityGroup& group = *at->group;
  const proto::ShardHolder& planned = group.data(at->index);
  if (planned.node() != options_.node_id ||
      planned.file_bytes() != p.holder.file_bytes() ||
      planned.manifest_xxh3() != p.holder.manifest_xxh3()) {
    CKPT_LOG_ERROR(
        "{}: the step's parity plan is for another copy of this "
        "shard (node {}, {} bytes): it stays unprotected by parity",
        what, planned.node(), planned.file_bytes());
    return true;
  }
  absl::StatusOr<std::map<std::string, proto::PeerInfo>> live = LivePeers();
  if (!live.ok()) {
    note(live.status().ToString());
    return false;
  }
  std::set<std::string> live_ids;
  for (const auto& [id, info] : *live) live_ids.insert(id);
  const std::vector<std::string> holders = ParityHolders(group, live_ids);
  std::vector<uint32_t> missing;
  int complete = 0;
  for (int j = 0; j < group.parity_nodes_size(); ++j) {
    const std::string& node = holders[j];
    auto peer = live->find(node);
    if (peer == live->end()) {
      note(absl::StrCat("no live node is left to hold parity block ", j,
                        " of group ", group.group(), " (planned on node ",
                        group.parity_nodes(j), ")"));
      return false;
    }
    absl::StatusOr<absl::optional<proto::ParityBlockRecord>> state = BlockOn(
        peer->second.address(), BlockKey(shard.job(), shard.step(), group, j));
    if (!state.ok()) {
      note(absl::StrCat("asking node ", node, ": ", state.status().ToString()));
      return false;
    }
    if (!state->has_value() || !HasPosition(**state, at->index)) {
      missing.push_back(j);
    } else if ((*state)->complete()) {
      ++complete;
    }
  }
  if (!missing.empty()) {
    absl::Status pushed =
        PushContributions(shard, group, at->index, missing, holders, *live);
    if (!pushed.ok()) {
      note(pushed.ToString());
      return false;
    }
    return false;  // looked at again in the next round
  }
  if (complete < group.parity_nodes_size()) return false;  // others to come
  std::vector<std::string> moved;
  for (int j = 0; j < group.parity_nodes_size(); ++j) {
    if (holders[j] != group.parity_nodes(j)) {
      moved.push_back(absl::StrCat("block ", j, " on ", holders[j], " for ",
                                   group.parity_nodes(j)));
    }
  }
  if (p.again) {
    CKPT_LOG_INFO("{}: protected again by {} parity (group {}{}{})", what,
                  code_.ToString(), group.group(), moved.empty() ? "" : ": ",
                  absl::StrJoin(moved, ", "));
    metrics_->Add("ckpt_parity_reprotected_total", {{"job", shard.job()}});
    metrics_->Add("ckpt_parity_reprotect_seconds_total", {{"job", shard.job()}},
                  absl::ToDoubleSeconds(absl::Now() - p.since));
    return true;
  }
  CKPT_LOG_INFO("{}: protected by {} parity (group {} of {} data blocks)", what,
                code_.ToString(), group.group(), group.data_size());
  on_protected_(shard);
  return true;
}

absl::Status ParityTier::PushContributions(
    const proto::ShardRecord& shard, const proto::ParityGroup& group,
    uint32_t position, const std::vector<uint32_t>& indices,
    const std::vector<std::string>& holders,
    const std::map<std::string, proto::PeerInfo>& live) {
  ASSIGN_OR_RETURN(snapshot::SelfContained view,
                   snapshot::OpenSelfContained(fs_, shard.shard_path()));
  // What the first piece of each stream says besides its bytes.
  auto first_piece = [&](uint32_t index) {
    proto::ParityPiece piece;
    *piece.mutable_block() = BlockKey(shard.job(), shard.step(), group, index);
    *piece.mutable_group() = group;
    piece.set_position(position);
    piece.set_from_node(options_.node_id);
    return piece;
  };
  struct Stream {
    uint32_t index;
    std::string node;
    std::unique_ptr<proto::CkptPeer::Stub> stub;
    grpc::ClientContext context;
    proto::PushParityResponse response;
    std::unique_ptr<grpc::ClientWriter<proto::ParityPiece>> writer;
    XXH3_state_t* hash = XXH3_createState();
    ~Stream() { XXH3_freeState(hash); }
  };
  std::vector<std::unique_ptr<Stream>> streams;
  for (uint32_t j : indices) {
    auto s = std::make_unique<Stream>();
    s->index = j;
    s->node = holders[j];
    auto peer = live.find(s->node);
    if (peer == live.end()) {
      return absl::UnavailableError(
          absl::StrCat("parity holder ", s->node, " is not live"));
    }
    s->stub = proto::CkptPeer::NewStub(channel_to_(peer->second.address()));
    s->context.set_deadline(absl::ToChronoTime(TransferDeadline(view.size)));
    s->writer = s->stub->PushParity(&s->context, &s->response);
    XXH3_64bits_reset(s->hash);
    streams.push_back(std::move(s));
  }
  std::string segment, coded;
  const absl::Time start = absl::Now();
  bool first = true;
  absl::Status failed;
  for (uint64_t at = 0; at < view.size && failed.ok();) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(kSegmentBytes, view.size - at));
    segment.resize(n);
    RETURN_IF_ERROR(view.file->Read(
        at, absl::MakeSpan(reinterpret_cast<uint8_t*>(segment.data()), n)));
    for (auto& s : streams) {
      proto::ParityPiece piece =
          first ? first_piece(s->index) : proto::ParityPiece();
      // Parity block 0's contribution is the segment itself; the others are
      // computed for the blocks sent to only.
      if (code_.Plain(static_cast<int>(position), static_cast<int>(s->index))) {
        piece.set_data(segment);
      } else {
        coded.resize(n);
        code_.ContributeTo(
            static_cast<int>(position), static_cast<int>(s->index),
            absl::MakeConstSpan(
                reinterpret_cast<const uint8_t*>(segment.data()), n),
            reinterpret_cast<uint8_t*>(coded.data()));
        piece.set_data(std::move(coded));
        coded = std::string();
      }
      XXH3_64bits_update(s->hash, piece.data().data(), n);
      if (!s->writer->Write(piece)) {
        failed = absl::UnavailableError(absl::StrCat(
            "node ", s->node, " stopped taking parity block ", s->index));
        break;
      }
    }
    CKPT_KILL_POINT("parity.segment_sent");
    first = false;
    at += n;
  }
  std::vector<std::string> errors;
  uint64_t sent = 0;
  for (auto& s : streams) {
    if (failed.ok()) {
      // An empty file: the first piece is the last.
      proto::ParityPiece last =
          first ? first_piece(s->index) : proto::ParityPiece();
      last.set_last(true);
      last.set_xxh3(XXH3_64bits_digest(s->hash));
      s->writer->Write(last);
    }
    s->writer->WritesDone();
    grpc::Status st = s->writer->Finish();
    if (!st.ok() && st.error_code() != grpc::StatusCode::ALREADY_EXISTS) {
      errors.push_back(absl::StrCat("parity block ", s->index, " on node ",
                                    s->node, ": ", st.error_message()));
    } else {
      sent += view.size;
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const Labels labels = {{"job", shard.job()}};
  metrics_->Add("ckpt_parity_sent_bytes_total", labels,
                static_cast<double>(sent));
  metrics_->Add("ckpt_parity_encode_seconds_total", labels, seconds);
  if (!failed.ok() && errors.empty()) errors.push_back(failed.ToString());
  if (!errors.empty()) {
    return absl::UnavailableError(
        absl::StrCat("pushing data block ", position,
                     "'s parity: ", absl::StrJoin(errors, "; ")));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::optional<proto::ParityBlockRecord>> ParityTier::BlockOn(
    const std::string& address, const proto::ParityBlockKey& key) {
  auto stub = proto::CkptPeer::NewStub(channel_to_(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  proto::ParityBlockRequest req;
  *req.mutable_block() = key;
  proto::ParityBlockState resp;
  RETURN_IF_ERROR(
      FromGrpc(stub->GetParityBlock(&context, req, &resp),
               absl::StrCat("the state of parity block ", key.index(),
                            " of group ", key.group(), " on ", address)));
  if (!resp.held()) return absl::optional<proto::ParityBlockRecord>();
  return absl::optional<proto::ParityBlockRecord>(resp.record());
}

absl::StatusOr<std::map<std::string, proto::PeerInfo>> ParityTier::LivePeers() {
  ASSIGN_OR_RETURN(std::vector<proto::PeerInfo> peers,
                   coordinator_->ListPeers());
  std::map<std::string, proto::PeerInfo> out;
  for (proto::PeerInfo& p : peers) out[p.node_id()] = std::move(p);
  return out;
}

void ParityTier::CollectGarbage(
    const std::string& job, const std::function<bool(uint64_t step)>& keep) {
  std::set<uint64_t> dropped;
  for (const proto::ParityBlockRecord& r : store_->List(job)) {
    if (keep(r.key().step())) continue;
    if (store_->Drop(r.key()).ok()) dropped.insert(r.key().step());
  }
  if (!dropped.empty()) {
    CKPT_LOG_INFO("parity of job {}: dropped the blocks of steps {}", job,
                  absl::StrJoin(dropped, ", "));
  }
}

}  // namespace ckpt::daemon
