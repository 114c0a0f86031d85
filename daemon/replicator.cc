#include "daemon/replicator.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "daemon/grpc_status.h"
#include "daemon/retention.h"
#include "io/bulk_transfer.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/peer.grpc.pb.h"
#include "snapshot/names.h"

namespace ckpt::daemon {
namespace {

constexpr size_t kPieceBytes = 4 << 20;

std::string Describe(const std::string& job, uint64_t step, uint32_t rank) {
  return absl::StrCat("job ", job, " step ", step, " rank ", rank);
}

// FNV-1a: a placement that is the same in every process and every run.
uint64_t StableHash(absl::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// A deadline for moving `bytes`: generous (20 MiB/s) plus a fixed margin.
absl::Time TransferDeadline(uint64_t bytes) {
  return absl::Now() + absl::Seconds(30) +
         absl::Seconds(static_cast<double>(bytes) / (20 << 20));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Replicator>> Replicator::Start(
    io::FileSystem* fs, ReplicationOptions options, Coordinator* coordinator,
    Metrics* metrics, OnReplicated on_replicated, OnPeersLost on_peers_lost) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(options.node_id));
  if (options.replicas < 0) {
    return absl::InvalidArgumentError("peer replicas must be 0 or more");
  }
  std::unique_ptr<Replicator> r(
      new Replicator(fs, std::move(options), coordinator, metrics,
                     std::move(on_replicated), std::move(on_peers_lost)));
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
  metrics->Declare("ckpt_replication_failures_total", T::kCounter,
                   "pushes to a peer that failed (the next peer is tried)");
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
                       OnReplicated on_replicated, OnPeersLost on_peers_lost)
    : fs_(fs),
      options_(std::move(options)),
      coordinator_(coordinator),
      metrics_(metrics),
      on_replicated_(std::move(on_replicated)),
      on_peers_lost_(std::move(on_peers_lost)),
      incarnation_([] {
        absl::BitGen gen;
        return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
      }()) {}

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
    for (Pending& p : work) {
      if (!peers.ok()) {
        left.push_back(std::move(p));
        continue;
      }
      if (!Replicate(p, *peers)) left.push_back(std::move(p));
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

absl::StatusOr<std::vector<proto::PeerInfo>> Replicator::Peers() {
  std::string address;
  {
    absl::MutexLock lock(&mu_);
    address = address_;
  }
  ASSIGN_OR_RETURN(std::vector<proto::PeerInfo> all, coordinator_->ListPeers());
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
                           const std::vector<proto::PeerInfo>& peers) {
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
      continue;
    }
    metrics_->Add("ckpt_replication_failures_total", {{"job", shard.job()}});
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
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(address);
  if (it != channels_.end()) return it->second;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  // A restarted peer is reached again at once, not after a long backoff.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto creds = options_.credentials != nullptr
                   ? options_.credentials
                   : grpc::InsecureChannelCredentials();
  auto channel = grpc::CreateCustomChannel(address, creds, args);
  channels_[address] = channel;
  return channel;
}

bool Replicator::Holds(const proto::ShardRecord& shard,
                       const proto::PeerInfo& peer) {
  absl::StatusOr<std::unique_ptr<io::ReadableFile>> file =
      fs_->NewReadableFile(shard.shard_path(), {});
  if (!file.ok()) return false;
  absl::StatusOr<uint64_t> size = (*file)->Size();
  if (!size.ok()) return false;
  auto stub = proto::CkptPeer::NewStub(ChannelTo(peer.address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  proto::LocateShardRequest req;
  req.mutable_shard()->set_job(shard.job());
  req.mutable_shard()->set_step(shard.step());
  req.mutable_shard()->set_rank(shard.rank());
  proto::LocateShardResponse resp;
  return stub->LocateShard(&ctx, req, &resp).ok() &&
         resp.tier() == proto::TIER_PEER && resp.file_bytes() == *size;
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
  if (bulk != nullptr && !address.empty()) {
    // The fast path: the peer fetches the file as a bulk transfer.
    ASSIGN_OR_RETURN(io::BulkServer::Ticket ticket,
                     bulk->Offer(shard.shard_path()));
    auto stub = proto::CkptPeer::NewStub(ChannelTo(peer.address()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(TransferDeadline(ticket.bytes)));
    proto::PullReplicaRequest req;
    req.mutable_shard()->set_job(shard.job());
    req.mutable_shard()->set_step(shard.step());
    req.mutable_shard()->set_rank(shard.rank());
    req.set_file_bytes(ticket.bytes);
    req.set_from_node(options_.node_id);
    req.set_host(address.substr(0, address.rfind(':')));
    req.set_port(static_cast<uint32_t>(bulk->port()));
    req.set_ticket(ticket.token);
    proto::PushReplicaResponse resp;
    grpc::Status pulled = stub->PullReplica(&ctx, req, &resp);
    if (pulled.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
      RETURN_IF_ERROR(FromGrpc(pulled, what));
      if (resp.bytes() != ticket.bytes) {
        return absl::DataLossError(absl::StrCat(what, ": the peer verified ",
                                                resp.bytes(), " of ",
                                                ticket.bytes, " bytes"));
      }
      metrics_->Add("ckpt_replicated_bytes_total", {{"job", shard.job()}},
                    static_cast<double>(ticket.bytes));
      return absl::OkStatus();
    }
    // A peer without PullReplica: the bytes go over the stream below.
  }
  ASSIGN_OR_RETURN(std::unique_ptr<io::ReadableFile> file,
                   fs_->NewReadableFile(shard.shard_path(), {}));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
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
  metrics_->Add("ckpt_replicated_bytes_total", {{"job", shard.job()}},
                static_cast<double>(size));
  return absl::OkStatus();
}

absl::StatusOr<proto::LocateShardResponse> Replicator::LocateOn(
    const proto::PeerInfo& peer, const ReplicaStore::Key& key,
    bool with_items) {
  auto stub = proto::CkptPeer::NewStub(ChannelTo(peer.address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  proto::LocateShardRequest req;
  req.mutable_shard()->set_job(key.job);
  req.mutable_shard()->set_step(key.step);
  req.mutable_shard()->set_rank(key.rank);
  req.set_with_items(with_items);
  proto::LocateShardResponse resp;
  RETURN_IF_ERROR(
      FromGrpc(stub->LocateShard(&ctx, req, &resp),
               absl::StrCat("locating ", Describe(key.job, key.step, key.rank),
                            " on node ", peer.node_id())));
  return resp;
}

absl::optional<proto::ShardRecord> Replicator::LocalCopy(const std::string& job,
                                                         uint64_t step,
                                                         uint32_t rank) {
  for (ReplicaStore* store : {held_.get(), fetched_.get()}) {
    if (absl::optional<ReplicaStore::Entry> e =
            store->Find({job, step, rank})) {
      absl::StatusOr<proto::ShardRecord> r = ReplicaStore::RecordOf(fs_, *e);
      if (r.ok()) return *std::move(r);
    }
  }
  return absl::nullopt;
}

std::vector<Replicator::PeerCopy> Replicator::Locate(const std::string& job,
                                                     uint64_t step,
                                                     uint32_t rank) {
  std::vector<PeerCopy> copies;
  absl::StatusOr<std::vector<proto::PeerInfo>> peers = Peers();
  if (!peers.ok()) return copies;
  for (const proto::PeerInfo& peer : *peers) {
    absl::StatusOr<proto::LocateShardResponse> resp =
        LocateOn(peer, {job, step, rank}, /*with_items=*/copies.empty());
    if (resp.ok() && resp->tier() != proto::TIER_UNSPECIFIED) {
      copies.push_back({peer.node_id(),
                        resp->tier(),
                        {resp->items().begin(), resp->items().end()}});
    }
  }
  // A peer's memory before a peer's disk, as Fetch tries them.
  std::stable_sort(
      copies.begin(), copies.end(),
      [](const PeerCopy& a, const PeerCopy& b) { return a.tier < b.tier; });
  return copies;
}

namespace {
// Why no peer gave a shard: `failed` (with each peer's error) when some had
// a copy, else NotFound naming the peers asked.
absl::Status NoCopy(absl::StatusCode failed, const std::string& what,
                    const std::vector<std::string>& failures,
                    const std::vector<std::string>& asked) {
  if (!failures.empty()) {
    return absl::Status(
        failed, absl::StrCat("no good copy of ", what, " on any live node (",
                             absl::StrJoin(failures, "; "), ")"));
  }
  return absl::NotFoundError(absl::StrCat(
      "no shard for ", what, " on this node or on any live peer (asked: ",
      asked.empty() ? "none is known" : absl::StrJoin(asked, ", "), ")"));
}
}  // namespace

absl::StatusOr<proto::ShardRecord> Replicator::Fetch(const std::string& job,
                                                     uint64_t step,
                                                     uint32_t rank) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  const ReplicaStore::Key key{job, step, rank};
  const std::string what = Describe(job, step, rank);
  absl::MutexLock fetching(&fetch_mu_);
  // Marked before anything is fetched: garbage collection running meanwhile
  // leaves the copy alone from the moment it appears.
  Used(key);
  // A copy here already: fetched before, or a replica a peer pushed here.
  for (ReplicaStore* store : {fetched_.get(), held_.get()}) {
    if (absl::optional<ReplicaStore::Entry> e = store->Find(key)) {
      absl::StatusOr<proto::ShardRecord> r = ReplicaStore::RecordOf(fs_, *e);
      if (r.ok()) return r;
      CKPT_LOG_WARN("{}: the copy in {} is unusable ({}); dropping it", what,
                    e->path, r.status().ToString());
      (void)store->Drop(key);
    }
  }
  ASSIGN_OR_RETURN(std::vector<proto::PeerInfo> peers, Peers());
  std::vector<std::string> asked;
  const std::vector<Candidate> candidates = PeersWith(key, peers, &asked);
  std::vector<std::string> failures;
  for (const Candidate& c : candidates) {
    const absl::Time start = absl::Now();
    std::string via;
    absl::StatusOr<ReplicaStore::Entry> got = FetchFrom(key, *c.peer, &via);
    if (got.ok()) {
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      const Labels labels = {
          {"job", job},
          {"source", c.tier == proto::TIER_PEER ? "peer_memory" : "peer_disk"}};
      metrics_->Add("ckpt_peer_fetched_bytes_total", labels,
                    static_cast<double>(got->bytes));
      metrics_->Add("ckpt_peer_fetch_seconds_total", labels, seconds);
      CKPT_LOG_INFO(
          "{}: fetched {} bytes from node {} ({}) over {} in {:.1f} ms, "
          "{:.0f} MiB/s",
          what, got->bytes, c.peer->node_id(), proto::Tier_Name(c.tier), via,
          seconds * 1e3, seconds > 0 ? got->bytes / seconds / (1 << 20) : 0.0);
      return ReplicaStore::RecordOf(fs_, *got);
    }
    CKPT_LOG_WARN("{}: fetching from node {}: {}", what, c.peer->node_id(),
                  got.status().ToString());
    failures.push_back(
        absl::StrCat(c.peer->node_id(), ": ", got.status().message()));
  }
  return NoCopy(absl::StatusCode::kDataLoss, what, failures, asked);
}

std::vector<Replicator::Candidate> Replicator::PeersWith(
    const ReplicaStore::Key& key, const std::vector<proto::PeerInfo>& peers,
    std::vector<std::string>* asked) {
  std::vector<Candidate> candidates;
  for (const proto::PeerInfo& peer : peers) {
    asked->push_back(peer.node_id());
    absl::StatusOr<proto::LocateShardResponse> resp =
        LocateOn(peer, key, /*with_items=*/false);
    if (resp.ok() && resp->tier() != proto::TIER_UNSPECIFIED) {
      candidates.push_back({&peer, resp->tier()});
    }
  }
  // A peer's memory before a peer's disk (DESIGN.md §2).
  std::stable_sort(
      candidates.begin(), candidates.end(),
      [](const Candidate& a, const Candidate& b) { return a.tier < b.tier; });
  return candidates;
}

absl::StatusOr<proto::PeerShardOffer> Replicator::OfferFromPeers(
    const std::string& job, uint64_t step, uint32_t rank) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  const std::string what = Describe(job, step, rank);
  if (LocalCopy(job, step, rank).has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " has a copy on this node"));
  }
  const ReplicaStore::Key key{job, step, rank};
  ASSIGN_OR_RETURN(std::vector<proto::PeerInfo> peers, Peers());
  std::vector<std::string> asked, failures;
  for (const Candidate& c : PeersWith(key, peers, &asked)) {
    const std::string& address = c.peer->address();
    auto stub = proto::CkptPeer::NewStub(ChannelTo(address));
    proto::FetchShardRequest req;
    req.mutable_shard()->set_job(job);
    req.mutable_shard()->set_step(step);
    req.mutable_shard()->set_rank(rank);
    req.set_with_manifest(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::ShardOffer offer;
    grpc::Status offered = stub->OfferShard(&ctx, req, &offer);
    if (offered.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        offered.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      return absl::FailedPreconditionError(
          absl::StrCat("node ", c.peer->node_id(),
                       " offers no bulk transfers: ", offered.error_message()));
    }
    if (!offered.ok()) {
      failures.push_back(
          absl::StrCat(c.peer->node_id(), ": ", offered.error_message()));
      continue;
    }
    proto::PeerShardOffer out;
    out.set_node(c.peer->node_id());
    out.set_tier(offer.tier());
    out.set_host(address.substr(0, address.rfind(':')));
    out.set_port(offer.port());
    out.set_ticket(offer.ticket());
    out.set_file_bytes(offer.file_bytes());
    out.set_manifest(offer.manifest());
    return out;
  }
  return NoCopy(absl::StatusCode::kUnavailable, what, failures, asked);
}

absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>>
Replicator::ReceiveFetched(const ReplicaStore::Key& key, uint64_t bytes) {
  absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>> r =
      fetched_->Receive(key, bytes);
  if (absl::IsResourceExhausted(r.status())) {
    // A cache: copies no restore is about to read make room.
    for (const ReplicaStore::Entry& e : fetched_->List()) {
      if (!InUse(e.key, absl::Seconds(10))) (void)fetched_->Drop(e.key);
    }
    r = fetched_->Receive(key, bytes);
  }
  return r;
}

absl::StatusOr<ReplicaStore::Entry> Replicator::FetchFrom(
    const ReplicaStore::Key& key, const proto::PeerInfo& peer,
    std::string* via) {
  const std::string what =
      absl::StrCat("fetching ", Describe(key.job, key.step, key.rank),
                   " from node ", peer.node_id(), " at ", peer.address());
  auto stub = proto::CkptPeer::NewStub(ChannelTo(peer.address()));
  proto::FetchShardRequest req;
  req.mutable_shard()->set_job(key.job);
  req.mutable_shard()->set_step(key.step);
  req.mutable_shard()->set_rank(key.rank);
  // The fast path: a bulk transfer over plain TCP, straight into the cache.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::ShardOffer offer;
    grpc::Status offered = stub->OfferShard(&ctx, req, &offer);
    if (offered.ok()) {
      *via = "a bulk transfer";
      ASSIGN_OR_RETURN(std::unique_ptr<ReplicaStore::Receiver> receiver,
                       ReceiveFetched(key, offer.file_bytes()));
      const std::string host =
          peer.address().substr(0, peer.address().rfind(':'));
      absl::Status got =
          io::BulkFetch(host, static_cast<int>(offer.port()), offer.ticket(),
                        receiver->Unfilled(), absl::Seconds(30));
      if (!got.ok()) {
        return absl::Status(got.code(),
                            absl::StrCat(what, ": ", got.message()));
      }
      RETURN_IF_ERROR(receiver->Filled(offer.file_bytes()));
      // The restore that asked for it verifies every chunk it reads.
      return receiver->Finish(/*every_chunk=*/false);
    }
    if (offered.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
        offered.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
      return FromGrpc(offered, what);
    }
    // Bulk transfers are off there (mutual TLS): stream over gRPC.
  }
  *via = "gRPC";
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(TransferDeadline(4ull << 30)));
  std::unique_ptr<grpc::ClientReader<proto::ShardPiece>> reader =
      stub->FetchShard(&ctx, req);
  std::unique_ptr<ReplicaStore::Receiver> receiver;
  absl::Status failed;
  proto::ShardPiece piece;
  while (failed.ok() && reader->Read(&piece)) {
    if (receiver == nullptr) {
      absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>> r =
          ReceiveFetched(key, piece.file_bytes());
      if (!r.ok()) {
        failed = r.status();
        break;
      }
      receiver = *std::move(r);
    }
    failed = receiver->Append(piece.data());
  }
  if (!failed.ok()) ctx.TryCancel();
  grpc::Status status = reader->Finish();
  RETURN_IF_ERROR(failed);
  RETURN_IF_ERROR(FromGrpc(status, what));
  if (receiver == nullptr) {
    return absl::DataLossError(absl::StrCat(what, ": the peer sent nothing"));
  }
  // The restore that asked for it verifies every chunk it reads.
  return receiver->Finish(/*every_chunk=*/false);
}

void Replicator::CollectGarbage(const std::string& job) {
  absl::StatusOr<std::vector<proto::CommitRecord>> commits =
      coordinator_->ListCommits(job);
  if (!commits.ok()) {
    CKPT_LOG_WARN("replicas of job {}: {}", job, commits.status().ToString());
    return;
  }
  // Replicas serve the steps committed at tier peer: the newest
  // `keep_steps` of them stay, and those of newer steps (still gathering
  // their replicas). A cached copy serves any committed step.
  std::vector<uint64_t> steps, on_peers;
  for (const proto::CommitRecord& c : *commits) {
    steps.push_back(c.step());
    if (c.tier() == proto::TIER_PEER) on_peers.push_back(c.step());
  }
  if (steps.empty()) return;  // nothing is committed: everything is in flight
  const size_t keep = static_cast<size_t>(std::max(options_.keep_steps, 1));
  auto newest_first = [keep](std::vector<uint64_t>& v) {
    std::sort(v.rbegin(), v.rend());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    const uint64_t newest = v.empty() ? 0 : v.front();
    if (v.size() > keep) v.resize(keep);
    return newest;
  };
  const uint64_t newest = newest_first(steps);
  const uint64_t newest_on_peers = newest_first(on_peers);
  std::set<uint64_t> held, cached;
  for (const ReplicaStore::Entry& e : held_->List(job)) {
    const bool kept = e.key.step > newest_on_peers ||
                      std::find(on_peers.begin(), on_peers.end(), e.key.step) !=
                          on_peers.end();
    if (!kept) {
      (void)held_->Drop(e.key);
      held.insert(e.key.step);
    }
  }
  for (const ReplicaStore::Entry& e : fetched_->List(job)) {
    const bool kept =
        e.key.step > newest ||
        std::find(steps.begin(), steps.end(), e.key.step) != steps.end() ||
        InUse(e.key, absl::Minutes(1));
    if (!kept) {
      (void)fetched_->Drop(e.key);
      cached.insert(e.key.step);
      absl::MutexLock lock(&mu_);
      fetched_used_.erase(e.key);
    }
  }
  if (!held.empty() || !cached.empty()) {
    CKPT_LOG_INFO(
        "replicas of job {}: held replicas of steps {} and fetched copies of "
        "steps {} dropped; peers keep steps {} and those above {}",
        job, StepList(held), StepList(cached),
        StepList({on_peers.begin(), on_peers.end()}), newest_on_peers);
  }
}

void Replicator::Used(const ReplicaStore::Key& key) {
  absl::MutexLock lock(&mu_);
  fetched_used_[key] = absl::Now();
}

bool Replicator::InUse(const ReplicaStore::Key& key,
                       absl::Duration grace) const {
  absl::MutexLock lock(&mu_);
  auto it = fetched_used_.find(key);
  return it != fetched_used_.end() && absl::Now() - it->second < grace;
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
