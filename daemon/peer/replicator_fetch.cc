// Replicator: what restores ask of the peer tier (where a shard is, fetching
// or streaming it from a peer, the fetched-copy cache) and garbage collection
// of replicas and cached copies. See replicator.h.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/common/describe.h"
#include "daemon/common/grpc_status.h"
#include "daemon/peer/peer_fetch.h"
#include "daemon/peer/replicator.h"
#include "daemon/persist/retention.h"
#include "io/host.h"
#include "io/logging.h"
#include "io/parallel.h"
#include "io/status_macros.h"
#include "proto/peer.grpc.pb.h"
#include "snapshot/manifest_seal.h"
#include "snapshot/names.h"

namespace ckpt::daemon {

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

class Replicator::FetchingKey {
 public:
  FetchingKey(Replicator& r, ReplicaStore::Key key)
      : r_(r), key_(std::move(key)) {
    absl::MutexLock lock(&r_.fetch_mu_);
    while (r_.fetching_.count(key_) != 0) r_.fetch_done_.Wait(&r_.fetch_mu_);
    r_.fetching_.insert(key_);
  }
  ~FetchingKey() {
    absl::MutexLock lock(&r_.fetch_mu_);
    r_.fetching_.erase(key_);
    r_.fetch_done_.SignalAll();
  }

 private:
  Replicator& r_;
  const ReplicaStore::Key key_;
};

absl::StatusOr<proto::ShardRecord> Replicator::Fetch(const std::string& job,
                                                     uint64_t step,
                                                     uint32_t rank) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  const ReplicaStore::Key key{job, step, rank};
  const std::string what = Describe(job, step, rank);
  FetchingKey fetching(*this, key);
  // Marked before anything is fetched: garbage collection running meanwhile
  // leaves the copy alone from the moment it appears.
  Used(key);
  absl::Status none;
  {
    absl::ReaderMutexLock from_peers(&rebuild_mu_);
    if (absl::optional<proto::ShardRecord> copy = CopyHere(key)) return *copy;
    absl::StatusOr<proto::ShardRecord> fetched = FetchFromPeers(key);
    if (fetched.ok()) return fetched;
    none = fetched.status();
  }
  absl::WriterMutexLock rebuilding(&rebuild_mu_);
  // A rebuild for another rank of its group may have made it meanwhile.
  if (absl::optional<proto::ShardRecord> copy = CopyHere(key)) return *copy;
  absl::StatusOr<proto::ShardRecord> rebuilt = Rebuilt(key);
  if (rebuilt.ok() || !absl::IsUnimplemented(rebuilt.status())) {
    if (rebuilt.ok()) return rebuilt;
    return absl::Status(
        rebuilt.status().code(),
        absl::StrCat(none.message(), "; ", rebuilt.status().message()));
  }
  return none;
}

absl::optional<proto::ShardRecord> Replicator::CopyHere(
    const ReplicaStore::Key& key) {
  // Fetched before, or a replica a peer pushed here.
  for (ReplicaStore* store : {fetched_.get(), held_.get()}) {
    if (absl::optional<ReplicaStore::Entry> e = store->Find(key)) {
      absl::StatusOr<proto::ShardRecord> r = ReplicaStore::RecordOf(fs_, *e);
      if (r.ok()) return *std::move(r);
      CKPT_LOG_WARN("{}: the copy in {} is unusable ({}); dropping it",
                    Describe(key.job, key.step, key.rank), e->path,
                    r.status().ToString());
      (void)store->Drop(key);
    }
  }
  return absl::nullopt;
}

absl::StatusOr<proto::ShardRecord> Replicator::FetchFromPeers(
    const ReplicaStore::Key& key) {
  const std::string what = Describe(key.job, key.step, key.rank);
  ASSIGN_OR_RETURN(std::vector<proto::PeerInfo> peers, Peers());
  std::vector<std::string> asked, unreachable;
  const std::vector<Candidate> candidates =
      PeersWith(key, peers, &asked, &unreachable);
  std::vector<std::string> failures;
  for (const Candidate& c : candidates) {
    const absl::Time start = absl::Now();
    std::string via;
    absl::StatusOr<ReplicaStore::Entry> got = FetchFrom(key, *c.peer, &via);
    if (got.ok()) {
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      const Labels labels = {
          {"job", key.job},
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
  absl::Status none =
      NoCopy(absl::StatusCode::kDataLoss, what, failures, asked);
  if (absl::IsNotFound(none)) {
    // Nobody has it now; a node coming back may.
    absl::Status restarting = Restarting(what, unreachable, peers);
    if (!restarting.ok()) {
      return absl::UnavailableError(
          absl::StrCat(none.message(), "; ", restarting.message()));
    }
  }
  return none;
}

absl::Status Replicator::Restarting(const std::string& what,
                                    const std::vector<std::string>& unreachable,
                                    const std::vector<proto::PeerInfo>& peers) {
  std::vector<std::string> nodes;
  for (const std::string& node : unreachable) {
    nodes.push_back(absl::StrCat(node, " (registered, not answering)"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (options_.reprotect_delay > absl::ZeroDuration()) {
      for (const std::string& node : last_seen_) {
        const bool live = std::any_of(
            peers.begin(), peers.end(),
            [&](const proto::PeerInfo& p) { return p.node_id() == node; });
        if (!live && awaited_.count(node) == 0) {
          nodes.push_back(absl::StrCat(
              node, " (lost just now; awaited for --reprotect-delay ",
              absl::FormatDuration(options_.reprotect_delay), ")"));
        }
      }
    }
    for (const auto& [node, since] : awaited_) {
      nodes.push_back(
          absl::StrCat(node, " (lost ",
                       absl::FormatDuration(absl::Trunc(
                           absl::Now() - since, absl::Milliseconds(100))),
                       " ago; awaited for --reprotect-delay ",
                       absl::FormatDuration(options_.reprotect_delay), ")"));
    }
  }
  if (nodes.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "node", nodes.size() > 1 ? "s " : " ", absl::StrJoin(nodes, ", "),
      " may be restarting with a copy of ", what));
}

void Replicator::SetRebuilder(Rebuilder rebuild) {
  absl::MutexLock lock(&mu_);
  rebuild_ = std::move(rebuild);
}

absl::StatusOr<proto::ShardRecord> Replicator::Rebuilt(
    const ReplicaStore::Key& key) {
  Rebuilder rebuild;
  {
    absl::MutexLock lock(&mu_);
    rebuild = rebuild_;
  }
  if (!rebuild) return absl::UnimplementedError("no parity");
  const absl::Time start = absl::Now();
  // Decoded straight into fetched copies' files.
  std::map<uint32_t, std::unique_ptr<ReplicaStore::Receiver>> receivers;
  absl::StatusOr<std::vector<uint32_t>> ranks = rebuild(
      key.job, key.step, key.rank,
      [&](uint32_t rank, uint64_t bytes) -> absl::StatusOr<RebuildWriter> {
        ASSIGN_OR_RETURN(
            std::unique_ptr<ReplicaStore::Receiver> r,
            ReceiveFetched({key.job, key.step, rank}, bytes, /*mapped=*/false));
        ReplicaStore::Receiver* receiver = r.get();
        receivers[rank] = std::move(r);
        return [receiver](uint64_t offset, absl::Span<const uint8_t> bytes) {
          return receiver->WriteAt(offset, bytes);
        };
      });
  if (!ranks.ok()) {
    CKPT_LOG_WARN("{}", ranks.status().ToString());
    return ranks.status();
  }
  // Every chunk is checked against its checksum (the files at once): a
  // damaged block of the group (a flipped byte in parity) decodes into a
  // chunk that fails here.
  std::vector<absl::StatusOr<ReplicaStore::Entry>> kept(
      ranks->size(), absl::UnknownError("not rebuilt"));
  io::ParallelFor(
      ranks->size(), static_cast<int>(ranks->size()),
      [&](size_t i) { kept[i] = receivers.at((*ranks)[i])->Finish(); });
  absl::StatusOr<ReplicaStore::Entry> entry;
  for (size_t i = 0; i < ranks->size(); ++i) {
    const ReplicaStore::Key k{key.job, key.step, (*ranks)[i]};
    if (!kept[i].ok()) {
      kept[i] = absl::Status(
          kept[i].status().code(),
          absl::StrCat(Describe(k.job, k.step, k.rank),
                       ": the file rebuilt from parity fails its checks (a "
                       "block of its group is damaged): ",
                       kept[i].status().message()));
      CKPT_LOG_WARN("{}", kept[i].status().ToString());
    } else if (k.rank != key.rank) {
      Used(k);  // its own restore is likely on its way
    }
    if (k.rank == key.rank) entry = std::move(kept[i]);
  }
  if (!entry.ok()) return entry.status();
  const Labels labels = {{"job", key.job}, {"source", "peer_parity"}};
  metrics_->Add("ckpt_peer_fetched_bytes_total", labels,
                static_cast<double>(entry->bytes));
  metrics_->Add("ckpt_peer_fetch_seconds_total", labels,
                absl::ToDoubleSeconds(absl::Now() - start));
  return ReplicaStore::RecordOf(fs_, *entry);
}

std::vector<Replicator::Candidate> Replicator::PeersWith(
    const ReplicaStore::Key& key, const std::vector<proto::PeerInfo>& peers,
    std::vector<std::string>* asked, std::vector<std::string>* unreachable) {
  std::vector<Candidate> candidates;
  for (const proto::PeerInfo& peer : peers) {
    asked->push_back(peer.node_id());
    absl::StatusOr<proto::LocateShardResponse> resp =
        LocateOn(peer, key, /*with_items=*/false);
    if (resp.ok() && resp->tier() != proto::TIER_UNSPECIFIED) {
      candidates.push_back({&peer, resp->tier()});
    }
    if (unreachable != nullptr && (absl::IsUnavailable(resp.status()) ||
                                   absl::IsDeadlineExceeded(resp.status()))) {
      unreachable->push_back(peer.node_id());
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
    // The client routes the stream by this manifest and checks the file's
    // own against it: with a cluster key, only a sealed one is handed on.
    if (auto keys = snapshot::InstalledSealKeys()) {
      if (absl::Status sealed = keys->Check(offer.manifest()); !sealed.ok()) {
        failures.push_back(
            absl::StrCat(c.peer->node_id(), "'s offer: ", sealed.message()));
        continue;
      }
    }
    proto::PeerShardOffer out;
    out.set_node(c.peer->node_id());
    out.set_tier(offer.tier());
    ASSIGN_OR_RETURN(std::string host, io::HostOfAddress(address));
    out.set_host(host);
    out.set_port(offer.port());
    out.set_ticket(offer.ticket());
    out.set_file_bytes(offer.file_bytes());
    out.set_manifest(offer.manifest());
    return out;
  }
  return NoCopy(absl::StatusCode::kUnavailable, what, failures, asked);
}

absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>>
Replicator::ReceiveFetched(const ReplicaStore::Key& key, uint64_t bytes,
                           bool mapped) {
  absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>> r =
      fetched_->Receive(key, bytes, mapped);
  if (absl::IsResourceExhausted(r.status())) {
    // A cache: copies no restore is about to read make room.
    for (const ReplicaStore::Entry& e : fetched_->List()) {
      if (!InUse(e.key, absl::Seconds(10)) && !StandIn(e.key)) {
        (void)fetched_->Drop(e.key);
      }
    }
    r = fetched_->Receive(key, bytes, mapped);
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
  const PeerFileCalls calls{
      [&](grpc::ClientContext* c, proto::ShardOffer* o) {
        return stub->OfferShard(c, req, o);
      },
      [&](grpc::ClientContext* c) { return stub->FetchShard(c, req); }};
  // Straight into the cache, in place.
  std::unique_ptr<ReplicaStore::Receiver> receiver;
  auto open = [&](uint64_t bytes) -> absl::StatusOr<FetchSink> {
    ASSIGN_OR_RETURN(receiver, ReceiveFetched(key, bytes));
    ReplicaStore::Receiver* r = receiver.get();
    return FetchSink{
        [r]() -> absl::StatusOr<absl::Span<uint8_t>> { return r->Unfilled(); },
        [r](uint64_t n) { (void)r->Filled(n); }};
  };
  RETURN_IF_ERROR(
      FetchFromPeer(peer.address(), absl::nullopt, what, calls, open, via));
  // The restore that asked for it verifies every chunk it reads.
  return receiver->Finish(/*every_chunk=*/false);
}

absl::StatusOr<absl::optional<Replicator::PeerRetention>> Replicator::Retention(
    const std::string& job) {
  ASSIGN_OR_RETURN(std::vector<proto::CommitRecord> commits,
                   coordinator_->ListCommits(job));
  // Replicas serve the steps committed at tier peer: the newest
  // `keep_steps` of them stay, and those of newer steps (still gathering
  // their replicas). A cached copy serves any committed step.
  PeerRetention r;
  for (const proto::CommitRecord& c : commits) {
    r.steps.push_back(c.step());
    if (c.tier() == proto::TIER_PEER) r.on_peers.push_back(c.step());
  }
  if (r.steps.empty()) {
    return absl::optional<PeerRetention>();  // everything is in flight
  }
  const size_t keep = static_cast<size_t>(std::max(options_.keep_steps, 1));
  auto newest_first = [keep](std::vector<uint64_t>& v) {
    std::sort(v.rbegin(), v.rend());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    const uint64_t newest = v.empty() ? 0 : v.front();
    if (v.size() > keep) v.resize(keep);
    return newest;
  };
  r.newest = newest_first(r.steps);
  r.newest_on_peers = newest_first(r.on_peers);
  // The step the job's epoch resumes from stays (see Coordinator::ResumeStep).
  ASSIGN_OR_RETURN(absl::optional<uint64_t> resume,
                   coordinator_->ResumeStep(job));
  if (resume.has_value()) {
    r.on_peers.push_back(*resume);
    r.steps.push_back(*resume);
  }
  return absl::optional<PeerRetention>(std::move(r));
}

bool Replicator::PeerRetention::KeepsHeld(uint64_t step) const {
  return step > newest_on_peers ||
         std::find(on_peers.begin(), on_peers.end(), step) != on_peers.end();
}

bool Replicator::PeerRetention::KeepsFetched(uint64_t step) const {
  return step > newest ||
         std::find(steps.begin(), steps.end(), step) != steps.end();
}

void Replicator::CollectGarbage(const std::string& job) {
  absl::StatusOr<absl::optional<PeerRetention>> retention = Retention(job);
  if (!retention.ok()) {
    CKPT_LOG_WARN("replicas of job {}: {}", job, retention.status().ToString());
    return;
  }
  if (!retention->has_value()) return;
  const PeerRetention& r = **retention;
  std::set<uint64_t> held, cached;
  // Newest first: an increment goes before the bases it reads, and a base
  // of a kept increment stays (Drop refuses it).
  const std::vector<ReplicaStore::Entry> entries = held_->List(job);
  for (auto e = entries.rbegin(); e != entries.rend(); ++e) {
    if (!r.KeepsHeld(e->key.step) && held_->Drop(e->key).ok())
      held.insert(e->key.step);
  }
  for (const ReplicaStore::Entry& e : fetched_->List(job)) {
    const bool keep =
        StandIn(e.key) ? r.KeepsHeld(e.key.step) : r.KeepsFetched(e.key.step);
    if (!keep && !InUse(e.key, absl::Minutes(1))) {
      (void)fetched_->Drop(e.key);
      cached.insert(e.key.step);
      absl::MutexLock lock(&mu_);
      fetched_used_.erase(e.key);
      stand_ins_.erase(e.key);
    }
  }
  if (!held.empty() || !cached.empty()) {
    CKPT_LOG_INFO(
        "replicas of job {}: held replicas of steps {} and fetched copies of "
        "steps {} dropped; peers keep steps {} and those above {}",
        job, StepList(held), StepList(cached),
        StepList({r.on_peers.begin(), r.on_peers.end()}), r.newest_on_peers);
  }
}

void Replicator::KeepAsStandIn(const std::string& job, uint64_t step,
                               uint32_t rank) {
  absl::MutexLock lock(&mu_);
  stand_ins_.insert(ReplicaStore::Key{job, step, rank});
}

bool Replicator::StandIn(const ReplicaStore::Key& key) const {
  absl::MutexLock lock(&mu_);
  return stand_ins_.count(key) > 0;
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

}  // namespace ckpt::daemon
