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
#include "io/background.h"
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

// One push of a data block's contributions to parity blocks of its group:
// a stream per block, fed segment after segment from the shard file.
class ContributionPush {
 public:
  ContributionPush(const snapshot::ErasureCode& code,
                   const proto::ShardRecord& shard,
                   const proto::ParityGroup& group, uint32_t position,
                   const std::string& from_node, io::RateLimiter* send_rate)
      : code_(code),
        shard_(shard),
        group_(group),
        position_(position),
        from_node_(from_node),
        send_rate_(send_rate) {}

  // A stream to parity block `index` on `node`.
  void Open(uint32_t index, const std::string& node,
            std::shared_ptr<grpc::Channel> channel, absl::Time deadline) {
    auto s = std::make_unique<Stream>();
    s->index = index;
    s->node = node;
    s->stub = proto::CkptPeer::NewStub(channel);
    s->context.set_deadline(absl::ToChronoTime(deadline));
    s->writer = s->stub->PushParity(&s->context, &s->response);
    XXH3_64bits_reset(s->hash);
    streams_.push_back(std::move(s));
  }

  // Every segment of the file to every stream; stops at the first stream
  // that fails (Unavailable) or the first read that does.
  absl::Status Send(const snapshot::SelfContained& view) {
    std::string segment;
    for (uint64_t at = 0; at < view.size;) {
      const size_t n = static_cast<size_t>(
          std::min<uint64_t>(kSegmentBytes, view.size - at));
      segment.resize(n);
      RETURN_IF_ERROR(view.file->Read(
          at, absl::MakeSpan(reinterpret_cast<uint8_t*>(segment.data()), n)));
      for (auto& s : streams_) RETURN_IF_ERROR(SendSegment(*s, segment));
      CKPT_KILL_POINT("parity.segment_sent");
      first_ = false;
      at += n;
    }
    return absl::OkStatus();
  }

  // Ends every stream (with its last piece, its checksum, when `complete`).
  // Returns how many blocks took the whole contribution.
  uint64_t Finish(bool complete) {
    uint64_t taken = 0;
    for (auto& s : streams_) {
      if (complete) {
        // An empty file: the first piece is the last.
        proto::ParityPiece last =
            first_ ? FirstPiece(s->index) : proto::ParityPiece();
        last.set_last(true);
        last.set_xxh3(XXH3_64bits_digest(s->hash));
        s->writer->Write(last);
      }
      s->writer->WritesDone();
      grpc::Status st = s->writer->Finish();
      if (!st.ok() && st.error_code() != grpc::StatusCode::ALREADY_EXISTS) {
        errors_.push_back(absl::StrCat("parity block ", s->index, " on node ",
                                       s->node, ": ", st.error_message()));
      } else {
        ++taken;
      }
    }
    return taken;
  }

  // The push's result: `sent`'s error and the holders'.
  absl::Status Outcome(const absl::Status& sent) {
    if (!sent.ok()) errors_.insert(errors_.begin(), sent.ToString());
    if (errors_.empty()) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("pushing data block ", position_,
                     "'s parity: ", absl::StrJoin(errors_, "; ")));
  }

 private:
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

  // What the first piece of each stream says besides its bytes.
  proto::ParityPiece FirstPiece(uint32_t index) const {
    proto::ParityPiece piece;
    *piece.mutable_block() =
        BlockKey(shard_.job(), shard_.step(), group_, index);
    *piece.mutable_group() = group_;
    piece.set_position(position_);
    piece.set_from_node(from_node_);
    return piece;
  }

  // Parity block 0's contribution is the segment itself; the others are
  // computed for the blocks sent to only.
  absl::Status SendSegment(Stream& s, const std::string& segment) {
    proto::ParityPiece piece =
        first_ ? FirstPiece(s.index) : proto::ParityPiece();
    const int from = static_cast<int>(position_);
    const int to = static_cast<int>(s.index);
    if (code_.Plain(from, to)) {
      piece.set_data(segment);
    } else {
      std::string coded(segment.size(), '\0');
      code_.ContributeTo(
          from, to,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(segment.data()),
                              segment.size()),
          reinterpret_cast<uint8_t*>(coded.data()));
      piece.set_data(std::move(coded));
    }
    XXH3_64bits_update(s.hash, piece.data().data(), segment.size());
    io::AcquireSend(send_rate_, piece.data().size());
    if (!s.writer->Write(piece)) {
      return absl::UnavailableError(absl::StrCat(
          "node ", s.node, " stopped taking parity block ", s.index));
    }
    return absl::OkStatus();
  }

  const snapshot::ErasureCode& code_;
  const proto::ShardRecord& shard_;
  const proto::ParityGroup& group_;
  const uint32_t position_;
  const std::string from_node_;
  io::RateLimiter* const send_rate_;  // null: uncapped
  std::vector<std::unique_ptr<Stream>> streams_;
  bool first_ = true;
  std::vector<std::string> errors_;
};

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
  io::EnterBackground();
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
  // Its file gone (retention dropped its step, or it was saved again and
  // replaced): nothing is left to protect, and it is not looked at again.
  if (!fs_->Exists(shard.shard_path()).value_or(true)) {
    CKPT_LOG_INFO("{}: its shard file is gone; no parity for it",
                  Describe(shard.job(), shard.step(), shard.rank()));
    return true;
  }
  if (Round r = PublishHolder(p); r != Round::kGoOn) return r == Round::kDone;
  absl::optional<proto::ParityPlan> plan;
  ParityPosition at;
  if (Round r = PlaceInPlan(p, &plan, &at); r != Round::kGoOn) {
    return r == Round::kDone;
  }
  const proto::ParityGroup& group = *at.group;
  absl::StatusOr<std::map<std::string, proto::PeerInfo>> live = LivePeers();
  if (!live.ok()) {
    Note(p, live.status().ToString());
    return false;
  }
  std::set<std::string> live_ids;
  for (const auto& [id, info] : *live) live_ids.insert(id);
  const std::vector<std::string> holders = ParityHolders(group, live_ids);
  absl::StatusOr<BlockSurvey> survey =
      SurveyBlocks(shard, group, at.index, holders, *live);
  if (!survey.ok()) {
    Note(p, std::string(survey.status().message()));
    return false;
  }
  if (!survey->missing.empty()) {
    absl::Status pushed = PushContributions(shard, group, at.index,
                                            survey->missing, holders, *live);
    if (!pushed.ok()) Note(p, pushed.ToString());
    return false;  // looked at again in the next round
  }
  if (survey->complete < group.parity_nodes_size()) return false;
  Protected(p, group, holders);
  return true;
}

void ParityTier::Note(const Pending& p, const std::string& why) const {
  // Said once, and then every 50 rounds.
  if (p.attempts % 50 != 0) return;
  CKPT_LOG_WARN("{}: parity not in place yet: {}",
                Describe(p.shard.job(), p.shard.step(), p.shard.rank()), why);
}

ParityTier::Round ParityTier::PublishHolder(Pending& p) {
  if (p.published) return Round::kGoOn;
  const proto::ShardRecord& shard = p.shard;
  absl::StatusOr<snapshot::SelfContained> view =
      snapshot::OpenSelfContained(fs_, shard.shard_path());
  if (!view.ok()) {
    CKPT_LOG_WARN("{}: cannot protect it with parity: {}",
                  Describe(shard.job(), shard.step(), shard.rank()),
                  view.status().ToString());
    return Round::kDone;  // its file is gone (collected, or saved again)
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
    Note(p, published.ToString());
    return Round::kAgain;
  }
  p.published = true;
  return Round::kGoOn;
}

ParityTier::Round ParityTier::PlaceInPlan(
    const Pending& p, absl::optional<proto::ParityPlan>* plan,
    ParityPosition* at) {
  const proto::ShardRecord& shard = p.shard;
  const std::string what = Describe(shard.job(), shard.step(), shard.rank());
  absl::StatusOr<absl::optional<proto::ParityPlan>> settled = PlanOf(shard);
  if (!settled.ok()) {
    Note(p, settled.status().ToString());
    return Round::kAgain;
  }
  if (!settled->has_value()) return Round::kAgain;  // ranks to persist yet
  *plan = std::move(*settled);
  absl::StatusOr<ParityPosition> found = FindInPlan(**plan, shard.rank());
  if (!found.ok()) {
    CKPT_LOG_ERROR("{}: {}", what, found.status().ToString());
    return Round::kDone;
  }
  *at = *found;
  const proto::ShardHolder& planned = at->group->data(at->index);
  if (planned.node() != options_.node_id ||
      planned.file_bytes() != p.holder.file_bytes() ||
      planned.manifest_xxh3() != p.holder.manifest_xxh3()) {
    CKPT_LOG_ERROR(
        "{}: the step's parity plan is for another copy of this "
        "shard (node {}, {} bytes): it stays unprotected by parity",
        what, planned.node(), planned.file_bytes());
    return Round::kDone;
  }
  return Round::kGoOn;
}

absl::StatusOr<ParityTier::BlockSurvey> ParityTier::SurveyBlocks(
    const proto::ShardRecord& shard, const proto::ParityGroup& group,
    uint32_t position, const std::vector<std::string>& holders,
    const std::map<std::string, proto::PeerInfo>& live) {
  BlockSurvey survey;
  for (int j = 0; j < group.parity_nodes_size(); ++j) {
    const std::string& node = holders[j];
    auto peer = live.find(node);
    if (peer == live.end()) {
      return absl::UnavailableError(absl::StrCat(
          "no live node is left to hold parity block ", j, " of group ",
          group.group(), " (planned on node ", group.parity_nodes(j), ")"));
    }
    absl::StatusOr<absl::optional<proto::ParityBlockRecord>> state = BlockOn(
        peer->second.address(), BlockKey(shard.job(), shard.step(), group, j));
    if (!state.ok()) {
      return absl::UnavailableError(
          absl::StrCat("asking node ", node, ": ", state.status().ToString()));
    }
    if (!state->has_value() || !HasPosition(**state, position)) {
      survey.missing.push_back(j);
    } else if ((*state)->complete()) {
      ++survey.complete;
    }
  }
  return survey;
}

void ParityTier::Protected(const Pending& p, const proto::ParityGroup& group,
                           const std::vector<std::string>& holders) {
  const proto::ShardRecord& shard = p.shard;
  const std::string what = Describe(shard.job(), shard.step(), shard.rank());
  if (!p.again) {
    CKPT_LOG_INFO("{}: protected by {} parity (group {} of {} data blocks)",
                  what, code_.ToString(), group.group(), group.data_size());
    on_protected_(shard);
    return;
  }
  std::vector<std::string> moved;
  for (int j = 0; j < group.parity_nodes_size(); ++j) {
    if (holders[j] != group.parity_nodes(j)) {
      moved.push_back(absl::StrCat("block ", j, " on ", holders[j], " for ",
                                   group.parity_nodes(j)));
    }
  }
  CKPT_LOG_INFO("{}: protected again by {} parity (group {}{}{})", what,
                code_.ToString(), group.group(), moved.empty() ? "" : ": ",
                absl::StrJoin(moved, ", "));
  metrics_->Add("ckpt_parity_reprotected_total", {{"job", shard.job()}});
  metrics_->Add("ckpt_parity_reprotect_seconds_total", {{"job", shard.job()}},
                absl::ToDoubleSeconds(absl::Now() - p.since));
}

absl::Status ParityTier::PushContributions(
    const proto::ShardRecord& shard, const proto::ParityGroup& group,
    uint32_t position, const std::vector<uint32_t>& indices,
    const std::vector<std::string>& holders,
    const std::map<std::string, proto::PeerInfo>& live) {
  ASSIGN_OR_RETURN(snapshot::SelfContained view,
                   snapshot::OpenSelfContained(fs_, shard.shard_path()));
  ContributionPush push(code_, shard, group, position, options_.node_id,
                        options_.send_rate);
  for (uint32_t j : indices) {
    auto peer = live.find(holders[j]);
    if (peer == live.end()) {
      return absl::UnavailableError(
          absl::StrCat("parity holder ", holders[j], " is not live"));
    }
    push.Open(j, holders[j], channel_to_(peer->second.address()),
              TransferDeadline(view.size));
  }
  const absl::Time start = absl::Now();
  const absl::Status sent = push.Send(view);
  const uint64_t bytes = push.Finish(sent.ok());
  const Labels labels = {{"job", shard.job()}};
  metrics_->Add("ckpt_parity_sent_bytes_total", labels,
                static_cast<double>(bytes * view.size));
  metrics_->Add("ckpt_parity_encode_seconds_total", labels,
                absl::ToDoubleSeconds(absl::Now() - start));
  return push.Outcome(sent);
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
