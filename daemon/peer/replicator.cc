// Replicator: start-up, the push loop and the pushes (tier T1), peer TLS.
// Restores' fetches and garbage collection are in replicator_fetch.cc.
#include "daemon/peer/replicator.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/common/describe.h"
#include "daemon/common/grpc_status.h"
#include "daemon/peer/peer_fetch.h"
#include "daemon/peer/replication_backlog.h"
#include "daemon/persist/retention.h"
#include "io/background.h"
#include "io/bulk_transfer.h"
#include "io/host.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/peer.grpc.pb.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/names.h"
#include "snapshot/self_contained.h"
#include "snapshot/shard_reader.h"

namespace ckpt::daemon {
namespace {

constexpr size_t kPieceBytes = 4 << 20;

// FNV-1a: a placement that is the same in every process and every run.
uint64_t StableHash(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Replicator>> Replicator::Start(
    io::FileSystem* fs, ReplicationOptions options, Coordinator* coordinator,
    Metrics* metrics, OnReplicated on_replicated, OnPeersLost on_peers_lost,
    OnPeerReach on_peer_reach) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(options.node_id));
  if (options.replicas < 0) {
    return absl::InvalidArgumentError("peer replicas must be 0 or more");
  }
  std::unique_ptr<Replicator> r(new Replicator(
      fs, std::move(options), coordinator, metrics, std::move(on_replicated),
      std::move(on_peers_lost), std::move(on_peer_reach)));
  ASSIGN_OR_RETURN(r->held_,
                   ReplicaStore::Open(fs, io::JoinPath(r->options_.dir, "held"),
                                      r->options_.held_budget_bytes));
  ASSIGN_OR_RETURN(
      r->fetched_,
      ReplicaStore::Open(fs, io::JoinPath(r->options_.dir, "fetched"),
                         r->options_.fetched_budget_bytes));
  using T = Metrics::Type;
  metrics->Declare("ckpt_replicated_bytes_total", T::kCounter,
                   "shard-file bytes pushed to peers and verified there");
  metrics->Declare("ckpt_replicated_increments_total", T::kCounter,
                   "shards pushed to a peer as increments (only the chunks "
                   "they store; the peer held their bases)");
  metrics->Declare("ckpt_replication_failures_total", T::kCounter,
                   "pushes to a peer that failed (the next peer is tried)");
  metrics->Declare("ckpt_replication_skipped_steps_total", T::kCounter,
                   "steps a replicator behind skipped for a newer one");
  metrics->Declare("ckpt_replication_pending_shards", T::kGauge,
                   "persisted shards held by fewer than K peers");
  metrics->Declare("ckpt_replica_bytes", T::kGauge,
                   "bytes of replicas this node holds for its peers");
  metrics->Declare("ckpt_peer_fetched_bytes_total", T::kCounter,
                   "shard-file bytes fetched from peers for restores");
  metrics->Declare("ckpt_peer_fetch_seconds_total", T::kCounter,
                   "time spent fetching those bytes (transfer, landing in "
                   "memory, checks)");
  Replicator* self = r.get();
  metrics->OnScrape([self](Metrics& m) {
    m.Set("ckpt_replication_pending_shards", {},
          static_cast<double>(self->pending()));
    m.Set("ckpt_replica_bytes", {},
          static_cast<double>(self->held_->used_bytes()));
  });
  r->thread_ = std::thread([self] { self->Loop(); });
  return r;
}

Replicator::Replicator(io::FileSystem* fs, ReplicationOptions options,
                       Coordinator* coordinator, Metrics* metrics,
                       OnReplicated on_replicated, OnPeersLost on_peers_lost,
                       OnPeerReach on_peer_reach)
    : fs_(fs),
      options_(std::move(options)),
      coordinator_(coordinator),
      metrics_(metrics),
      on_replicated_(std::move(on_replicated)),
      on_peers_lost_(std::move(on_peers_lost)),
      on_peer_reach_(std::move(on_peer_reach)),
      incarnation_([] {
        absl::BitGen gen;
        return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
      }()),
      directory_(coordinator, options_.node_id) {}

Replicator::~Replicator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Replicator::SetBulkServer(std::shared_ptr<io::BulkServer> bulk) {
  absl::MutexLock lock(&mu_);
  bulk_ = std::move(bulk);
}

void Replicator::SetAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  address_ = address;
  wake_ = true;
}

void Replicator::Enqueue(const proto::ShardRecord& shard,
                         const std::vector<std::string>& holders) {
  if (options_.replicas == 0) return;
  absl::MutexLock lock(&mu_);
  for (Pending& p : pending_) {
    if (p.shard.job() == shard.job() && p.shard.step() == shard.step() &&
        p.shard.rank() == shard.rank()) {
      p.shard = shard;
      return;
    }
  }
  pending_.push_back({shard, holders});
  wake_ = true;
}

size_t Replicator::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

void Replicator::Loop() {
  io::EnterBackground();
  absl::Time last_publish = absl::InfinitePast();
  while (true) {
    std::vector<Pending> work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || wake_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), options_.retry_interval);
      if (stopping_) return;
      wake_ = false;
      work.swap(pending_);
    }
    // Publishing (again, should a lapsed lease have taken it) is cheap; do it
    // at most once per interval when there is nothing to push.
    absl::StatusOr<std::vector<proto::PeerInfo>> peers =
        absl::UnavailableError("not asked");
    if (!work.empty() ||
        absl::Now() - last_publish >= options_.retry_interval) {
      peers = Peers();
      last_publish = absl::Now();
    }
    if (peers.ok()) {
      std::map<std::string, std::string> now;
      for (const proto::PeerInfo& p : *peers) {
        now[p.node_id()] = p.incarnation();
      }
      // Gone, or back as another start: what it held is checked again.
      std::vector<std::string> lost;
      for (const auto& [node, incarnation] : known_peers_) {
        auto it = now.find(node);
        if (it == now.end() || it->second != incarnation) {
          lost.push_back(node);
        }
      }
      known_peers_ = std::move(now);
      // A node back as another start is checked at once (it is here to be
      // pushed to); one gone, once the delay has passed.
      std::erase_if(lost, [&](const std::string& node) {
        if (known_peers_.count(node) > 0) return false;
        if (lost_since_.emplace(node, absl::Now()).second &&
            options_.reprotect_delay > absl::ZeroDuration()) {
          CKPT_LOG_INFO(
              "node {} lost: what it held is made again in {} "
              "(--reprotect-delay), restores first",
              node, absl::FormatDuration(options_.reprotect_delay));
        }
        return true;
      });
      for (auto it = lost_since_.begin(); it != lost_since_.end();) {
        if (absl::Now() - it->second < options_.reprotect_delay) {
          ++it;
          continue;
        }
        lost.push_back(it->first);
        it = lost_since_.erase(it);
      }
      {
        absl::MutexLock lock(&mu_);
        last_seen_.clear();
        for (const auto& [node, incarnation] : known_peers_) {
          last_seen_.insert(node);
        }
        awaited_.clear();
        for (const auto& [node, since] : lost_since_) {
          if (known_peers_.count(node) == 0) awaited_.emplace(node, since);
        }
      }
      if (!lost.empty() && on_peers_lost_) {
        on_peers_lost_(lost);
        absl::MutexLock lock(&mu_);
        // What that enqueued goes out in this round.
        work.insert(work.end(), std::make_move_iterator(pending_.begin()),
                    std::make_move_iterator(pending_.end()));
        pending_.clear();
      }
    }
    std::vector<Pending> left;
    if (peers.ok()) work = ThinBacklog(std::move(work), &left);
    std::set<std::string> unreachable;
    for (Pending& p : work) {
      if (!peers.ok()) {
        left.push_back(std::move(p));
        continue;
      }
      if (!Replicate(p, *peers, unreachable)) left.push_back(std::move(p));
    }
    if (!work.empty() && !peers.ok()) {
      CKPT_LOG_WARN("replication: no peer list: {}", peers.status().ToString());
    }
    absl::MutexLock lock(&mu_);
    // Shards enqueued meanwhile go after the ones that waited.
    left.insert(left.end(), std::make_move_iterator(pending_.begin()),
                std::make_move_iterator(pending_.end()));
    pending_ = std::move(left);
  }
}

std::vector<Replicator::Pending> Replicator::ThinBacklog(
    std::vector<Pending> work, std::vector<Pending>* later) {
  std::map<std::string, std::set<uint64_t>> steps;  // job -> waiting steps
  for (const Pending& p : work) steps[p.shard.job()].insert(p.shard.step());
  std::map<std::string, BacklogChoice> choices;
  for (auto& [job, waiting] : steps) {
    if (waiting.size() <= kBacklogSteps) continue;
    // Shards of steps committed at the tier already are pushed again (a
    // peer that held them left): they stay out of the choice.
    absl::StatusOr<absl::optional<uint64_t>> latest =
        coordinator_->LatestCommitted(job, proto::TIER_PEER);
    if (!latest.ok()) continue;
    const uint64_t after = latest->value_or(0);
    if (latest->has_value()) {
      waiting.erase(waiting.begin(), waiting.upper_bound(after));
    }
    absl::StatusOr<std::set<uint64_t>> voted =
        coordinator_->StepsVotedAt(job, proto::TIER_PEER, after);
    if (!voted.ok()) continue;
    BacklogChoice choice = ChooseFromBacklog(waiting, *voted, kBacklogSteps);
    if (!choice.thinned) continue;
    CKPT_LOG_INFO(
        "replication of job {} is {} steps behind: pushing step {}{}, "
        "skipping steps {}",
        job, waiting.size(), choice.push,
        voted->count(choice.push) > 0 ? " (other ranks replicated it)" : "",
        StepList(choice.dropped));
    metrics_->Add("ckpt_replication_skipped_steps_total", {{"job", job}},
                  static_cast<double>(choice.dropped.size()));
    choices[job] = std::move(choice);
  }
  if (choices.empty()) return work;
  std::vector<Pending> now;
  for (Pending& p : work) {
    auto it = choices.find(p.shard.job());
    if (it == choices.end()) {
      now.push_back(std::move(p));
    } else if (it->second.dropped.count(p.shard.step()) > 0) {
      continue;
    } else if (it->second.later.count(p.shard.step()) > 0) {
      later->push_back(std::move(p));
    } else {
      now.push_back(std::move(p));
    }
  }
  return now;
}

absl::StatusOr<std::vector<proto::PeerInfo>> Replicator::Peers() {
  std::string address;
  {
    absl::MutexLock lock(&mu_);
    address = address_;
  }
  const absl::Time asking = absl::Now();
  ASSIGN_OR_RETURN(std::vector<proto::PeerInfo> all, coordinator_->ListPeers());
  directory_.Learn(all, asking);
  std::vector<proto::PeerInfo> others;
  bool published = false;
  for (proto::PeerInfo& p : all) {
    if (p.node_id() == options_.node_id) {
      // A key left by this node's previous start (its lease not yet expired)
      // is replaced by this start's.
      published = p.address() == address && p.incarnation() == incarnation_;
    } else {
      others.push_back(std::move(p));
    }
  }
  if (!published && !address.empty()) {
    proto::PeerInfo me;
    me.set_node_id(options_.node_id);
    me.set_address(address);
    me.set_failure_domain(options_.failure_domain);
    me.set_incarnation(incarnation_);
    absl::Status s = coordinator_->PublishPeer(me);
    if (!s.ok()) {
      CKPT_LOG_WARN("replication: publishing this node's peer address: {}",
                    s.ToString());
    }
  }
  return others;
}

bool Replicator::Replicate(Pending& p,
                           const std::vector<proto::PeerInfo>& peers,
                           std::set<std::string>& unreachable) {
  const proto::ShardRecord& shard = p.shard;
  const size_t want = static_cast<size_t>(options_.replicas);
  // Other failure domains first; within a group, an order of its own per rank
  // so that the ranks of a node spread over the peers.
  std::vector<const proto::PeerInfo*> order;
  for (const proto::PeerInfo& peer : peers) {
    if (std::find(p.holders.begin(), p.holders.end(), peer.node_id()) ==
        p.holders.end()) {
      order.push_back(&peer);
    }
  }
  const std::string spread = absl::StrCat(shard.job(), "/", shard.rank());
  std::sort(
      order.begin(), order.end(),
      [&](const proto::PeerInfo* a, const proto::PeerInfo* b) {
        const bool a_same = !options_.failure_domain.empty() &&
                            a->failure_domain() == options_.failure_domain;
        const bool b_same = !options_.failure_domain.empty() &&
                            b->failure_domain() == options_.failure_domain;
        if (a_same != b_same) return !a_same;
        return StableHash(spread + a->node_id()) <
               StableHash(spread + b->node_id());
      });
  for (const proto::PeerInfo* peer : order) {
    if (p.holders.size() >= want) break;
    if (unreachable.count(peer->node_id()) > 0) continue;
    absl::Status pushed;
    if (Holds(shard, *peer)) {
      CKPT_LOG_INFO("{}: node {} still holds its replica",
                    Describe(shard.job(), shard.step(), shard.rank()),
                    peer->node_id());
    } else {
      pushed = Push(shard, *peer);
    }
    if (pushed.ok()) {
      p.holders.push_back(peer->node_id());
      if (on_peer_reach_) on_peer_reach_(shard.job(), peer->node_id(), pushed);
      continue;
    }
    metrics_->Add("ckpt_replication_failures_total", {{"job", shard.job()}});
    if (absl::IsUnavailable(pushed) || absl::IsDeadlineExceeded(pushed)) {
      // Down, or restarted at another address (chaos seed 2630233375: a round
      // of a thousand shards spent 3 s on each against a stale address).
      unreachable.insert(peer->node_id());
      if (on_peer_reach_) on_peer_reach_(shard.job(), peer->node_id(), pushed);
    }
    if (absl::IsNotFound(pushed) &&
        !fs_->Exists(shard.shard_path()).value_or(false)) {
      // Garbage collection dropped the shard: nothing left to replicate.
      return true;
    }
    if (p.attempts == 0 || p.attempts % 30 == 0) {
      CKPT_LOG_WARN("replication of {} to node {}: {}",
                    Describe(shard.job(), shard.step(), shard.rank()),
                    peer->node_id(), pushed.ToString());
    }
  }
  ++p.attempts;
  if (p.holders.size() < want) return false;
  on_replicated_(shard, p.holders);
  return true;
}

std::shared_ptr<grpc::Channel> Replicator::ChannelTo(
    const std::string& address) {
  // With mutual TLS the peer is the node its certificate names: the name
  // checked is the node's id, not the host it was dialed at.
  const std::string node = options_.credentials != nullptr
                               ? directory_.NodeAt(address)
                               : std::string();
  const std::string key = absl::StrCat(address, "|", node);
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(key);
  if (it != channels_.end()) return it->second;
  grpc::ChannelArguments args;
  if (!node.empty()) args.SetSslTargetNameOverride(node);
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  // A restarted peer is reached again at once, not after a long backoff.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto creds = options_.credentials != nullptr
                   ? options_.credentials
                   : grpc::InsecureChannelCredentials();
  auto channel = grpc::CreateCustomChannel(address, creds, args);
  channels_[key] = channel;
  return channel;
}

absl::StatusOr<snapshot::SelfContained> Replicator::Outgoing(
    const proto::ShardRecord& shard, const proto::PeerInfo& peer,
    bool* increment) {
  return snapshot::OpenForReceiver(
      fs_, shard.shard_path(),
      [&](const proto::BaseShard& b) {
        absl::StatusOr<proto::LocateShardResponse> held =
            LocateOn(peer, {shard.job(), b.step(), shard.rank()}, false);
        return held.ok() && held->tier() == proto::TIER_PEER &&
               held->held_manifest_xxh3() == b.manifest_xxh3();
      },
      increment);
}

void Replicator::Sent(const proto::ShardRecord& shard, uint64_t bytes,
                      bool increment) {
  metrics_->Add("ckpt_replicated_bytes_total", {{"job", shard.job()}},
                static_cast<double>(bytes));
  if (increment) {
    metrics_->Add("ckpt_replicated_increments_total", {{"job", shard.job()}},
                  1);
  }
}

bool Replicator::Holds(const proto::ShardRecord& shard,
                       const proto::PeerInfo& peer) {
  // The peer holds this very save when its copy is the file as it is here
  // (an increment kept beside its bases) or its self-contained form: by
  // manifest checksum. A size alone would take another save of the step,
  // as large (a step saved again after a restart), for this one.
  absl::StatusOr<snapshot::SelfContained> view =
      snapshot::OpenSelfContained(fs_, shard.shard_path());
  absl::StatusOr<uint64_t> own =
      snapshot::ManifestChecksumOf(fs_, shard.shard_path());
  if (!view.ok() || !own.ok()) return false;
  const uint64_t whole = snapshot::Checksum(
      {reinterpret_cast<const uint8_t*>(view->manifest_bytes.data()),
       view->manifest_bytes.size()});
  absl::StatusOr<proto::LocateShardResponse> held =
      LocateOn(peer, {shard.job(), shard.step(), shard.rank()}, false);
  return held.ok() && held->tier() == proto::TIER_PEER &&
         (held->held_manifest_xxh3() == *own ||
          held->held_manifest_xxh3() == whole);
}

absl::Status Replicator::Push(const proto::ShardRecord& shard,
                              const proto::PeerInfo& peer) {
  const std::string what = absl::StrCat(
      "pushing ", Describe(shard.job(), shard.step(), shard.rank()),
      " to node ", peer.node_id(), " at ", peer.address());
  std::shared_ptr<io::BulkServer> bulk;  // kept alive while in use
  std::string address;
  {
    absl::MutexLock lock(&mu_);
    bulk = bulk_;
    address = address_;
  }
  bool increment = false;
  ASSIGN_OR_RETURN(snapshot::SelfContained view,
                   Outgoing(shard, peer, &increment));
  if (bulk != nullptr && !address.empty()) {
    // The fast path: the peer fetches the file as a bulk transfer.
    ASSIGN_OR_RETURN(io::BulkServer::Ticket ticket,
                     view.incremental
                         ? bulk->Offer(std::move(view.file), view.size)
                         : bulk->Offer(shard.shard_path()));
    auto stub = proto::CkptPeer::NewStub(ChannelTo(peer.address()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(TransferDeadline(ticket.bytes)));
    proto::PullReplicaRequest req;
    req.mutable_shard()->set_job(shard.job());
    req.mutable_shard()->set_step(shard.step());
    req.mutable_shard()->set_rank(shard.rank());
    req.set_file_bytes(ticket.bytes);
    req.set_from_node(options_.node_id);
    ASSIGN_OR_RETURN(std::string host, io::HostOfAddress(address));
    req.set_host(host);
    req.set_port(static_cast<uint32_t>(bulk->port()));
    req.set_ticket(ticket.token);
    proto::PushReplicaResponse resp;
    grpc::Status pulled = stub->PullReplica(&ctx, req, &resp);
    // PERMISSION_DENIED: the peer sees this node's calls come from another
    // address than the one it would fetch from (a node of several
    // interfaces), and dials only its caller.
    if (pulled.error_code() != grpc::StatusCode::UNIMPLEMENTED &&
        pulled.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
      RETURN_IF_ERROR(FromGrpc(pulled, what));
      if (resp.bytes() != ticket.bytes) {
        return absl::DataLossError(absl::StrCat(what, ": the peer verified ",
                                                resp.bytes(), " of ",
                                                ticket.bytes, " bytes"));
      }
      Sent(shard, ticket.bytes, increment);
      return absl::OkStatus();
    }
    // A peer without PullReplica, or that would not dial this node: the
    // bytes go over the stream below.
  }
  if (view.file == nullptr) {  // offered above to a peer that cannot pull
    ASSIGN_OR_RETURN(view, Outgoing(shard, peer, &increment));
  }
  std::unique_ptr<io::ReadableFile> file = std::move(view.file);
  const uint64_t size = view.size;
  auto stub = proto::CkptPeer::NewStub(ChannelTo(peer.address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(TransferDeadline(size)));
  proto::PushReplicaResponse resp;
  std::unique_ptr<grpc::ClientWriter<proto::ReplicaPiece>> writer =
      stub->PushReplica(&ctx, &resp);
  proto::ReplicaPiece piece;
  piece.mutable_shard()->set_job(shard.job());
  piece.mutable_shard()->set_step(shard.step());
  piece.mutable_shard()->set_rank(shard.rank());
  piece.set_file_bytes(size);
  piece.set_from_node(options_.node_id);
  absl::Status read;
  for (uint64_t at = 0; at < size;) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(kPieceBytes, size - at));
    std::string* data = piece.mutable_data();
    data->resize(n);
    read = file->Read(
        at, absl::MakeSpan(reinterpret_cast<uint8_t*>(data->data()), n));
    if (!read.ok()) break;
    io::AcquireSend(options_.send_rate.get(), n);
    if (!writer->Write(piece)) break;  // the stream broke: Finish says why
    at += n;
    piece.Clear();
    CKPT_KILL_POINT("replicator.piece_sent");
  }
  if (!read.ok()) ctx.TryCancel();
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (!read.ok()) return read;
  RETURN_IF_ERROR(FromGrpc(status, what));
  if (resp.bytes() != size) {
    return absl::DataLossError(absl::StrCat(
        what, ": the peer verified ", resp.bytes(), " of ", size, " bytes"));
  }
  Sent(shard, size, increment);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadPeerTlsFile(const std::string& file) {
  std::ifstream in(file);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("peer TLS: cannot read ", file));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer TLS: ", file, " is not a PEM file"));
  }
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerTlsCredentials(
    const std::string& ca_file, const std::string& cert_file,
    const std::string& key_file) {
  grpc::SslCredentialsOptions o;
  ASSIGN_OR_RETURN(o.pem_root_certs, ReadPeerTlsFile(ca_file));
  ASSIGN_OR_RETURN(o.pem_cert_chain, ReadPeerTlsFile(cert_file));
  ASSIGN_OR_RETURN(o.pem_private_key, ReadPeerTlsFile(key_file));
  return grpc::SslCredentials(o);
}

}  // namespace ckpt::daemon
