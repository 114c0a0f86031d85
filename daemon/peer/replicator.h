// Replicator is ckptd's side of tier T1 (DESIGN.md §2-§3). It pushes the shard
// file of every shard this node persisted to K peers, chosen among the live
// nodes that published a peer address, other failure domains first; a push
// counts only when the peer verified the whole file, and once K peers hold the
// shard the service votes TIER_PEER for it. A push that fails (the peer died
// mid-transfer, it is full) moves on to the next peer; a shard short of K
// peers is tried again every `retry_interval`, so replication reaches K again
// when peers return; when a peer that held replicas leaves, or comes back as a
// new incarnation (a restarted daemon, a replacement machine under the same
// id), the shards it held are checked and pushed again where missing, once
// `reprotect_delay` has passed (restores first: the ones that follow a loss
// have the network and the cores to themselves meanwhile). It also
// fetches, for a restore, a shard this node lacks from the peers that have one
// (a replica in memory first, then the owner's disk), verifies it and keeps it
// in a local cache. It keeps the replicas peers pushed here (ReplicaStore) and
// drops them, and cached copies, once retention no longer keeps their step.
//
// Thread-safety: thread-safe; one thread pushes.
#ifndef CKPT_DAEMON_PEER_REPLICATOR_H_
#define CKPT_DAEMON_PEER_REPLICATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "daemon/common/metrics.h"
#include "daemon/coord/coordinator.h"
#include "daemon/peer/peer_directory.h"
#include "daemon/peer/replica_store.h"
#include "io/file_system.h"
#include "io/rate_limiter.h"
#include "proto/catalog.pb.h"
#include "proto/daemon.pb.h"
#include "proto/peer.pb.h"
#include "snapshot/self_contained.h"

namespace grpc {
class Channel;
class ChannelCredentials;
}  // namespace grpc

namespace ckpt::io {
class BulkServer;
}  // namespace ckpt::io

namespace ckpt::daemon {

struct ReplicationOptions {
  std::string node_id;
  std::string failure_domain;
  // K: peers that hold each shard. 0 keeps replicas for others and fetches
  // from them, but pushes nothing.
  int replicas = 1;
  // On tmpfs (memory): <dir>/held (replicas pushed here), <dir>/fetched
  // (copies fetched for restores).
  std::string dir;
  uint64_t held_budget_bytes = 1ull << 30;
  uint64_t fetched_budget_bytes = 1ull << 30;
  // Per job, the newest committed steps whose replicas and fetched copies
  // stay (steps newer than the latest commit, in progress, stay too).
  int keep_steps = 1;
  // Credentials for the connections to peers (mutual TLS); null: insecure.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  absl::Duration retry_interval = absl::Seconds(1);
  // From a loss seen to OnPeersLost: what the lost nodes held (replicas,
  // parity, data shards rebuilt on stand-ins) is made again only then.
  absl::Duration reprotect_delay = absl::Seconds(10);
  int max_message_bytes = 8 << 20;
  // Every byte this node sends to peers draws on it (--peer-send-rate:
  // replicas, parity, copies served, published versions); null: uncapped.
  std::shared_ptr<io::RateLimiter> send_rate;
};

class Replicator {
 public:
  // Called (on the pushing thread) once K peers verified a shard.
  using OnReplicated = std::function<void(
      const proto::ShardRecord& shard, const std::vector<std::string>& nodes)>;
  // Called (on the pushing thread) when peers left (their lease expired):
  // the shards they held replicas of are to be enqueued again.
  using OnPeersLost = std::function<void(const std::vector<std::string>& lost)>;
  // Called (on the pushing thread) when a push to a peer found it, or did
  // not: `status` OK once the peer holds the shard, or the error when the
  // peer could not be reached (down, or no route: Unavailable or
  // DeadlineExceeded). Other refusals are not the link's.
  using OnPeerReach =
      std::function<void(const std::string& job, const std::string& node,
                         const absl::Status& status)>;

  static absl::StatusOr<std::unique_ptr<Replicator>> Start(
      io::FileSystem* fs, ReplicationOptions options, Coordinator* coordinator,
      Metrics* metrics, OnReplicated on_replicated,
      OnPeersLost on_peers_lost = nullptr, OnPeerReach on_peer_reach = nullptr);
  ~Replicator();

  // Where this node's peer service listens (known once it started): published
  // for the other nodes, and again whenever it went missing (a lease that
  // expired took it along).
  void SetAddress(const std::string& address);
  // This node's bulk server (null: none, with mutual TLS): pushes then offer
  // the file and the peer pulls it (PullReplica) instead of a gRPC stream.
  void SetBulkServer(std::shared_ptr<io::BulkServer> bulk);
  // A persisted shard (state PERSISTED, `shard_path` set) to push; nodes that
  // already hold it count.
  void Enqueue(const proto::ShardRecord& shard,
               const std::vector<std::string>& holders = {});
  // A shard this node does not have, from a local cached copy or else from a
  // peer. NotFound names the peers asked when none has a good copy.
  absl::StatusOr<proto::ShardRecord> Fetch(const std::string& job,
                                           uint64_t step, uint32_t rank);
  // The peers that have a copy of a shard, a replica in memory before an
  // owner's disk (the order Fetch tries them in), without fetching; the first
  // one found also describes the shard's items.
  struct PeerCopy {
    std::string node;
    proto::Tier tier;  // TIER_PEER (memory) or TIER_LOCAL_DISK
    std::vector<proto::Item> items;
  };
  std::vector<PeerCopy> Locate(const std::string& job, uint64_t step,
                               uint32_t rank);
  // A peer's offer of a shard this node has no copy of, with its manifest,
  // for a client to stream (proto PeerShardOffer): memory before disk as in
  // Fetch. FailedPrecondition when this node has a copy, or the peer has no
  // bulk transfers (mutual TLS).
  absl::StatusOr<proto::PeerShardOffer> OfferFromPeers(const std::string& job,
                                                       uint64_t step,
                                                       uint32_t rank);
  // A copy of a shard this node has in memory already: a replica a peer
  // pushed here, or one fetched before (as Fetch answers it, nothing
  // fetched).
  absl::optional<proto::ShardRecord> LocalCopy(const std::string& job,
                                               uint64_t step, uint32_t rank);
  // Keeps a fetched copy as a stand-in for a lost data shard of a parity
  // group (ParityTier::RepairLostData): the cache never evicts it to make
  // room, and it goes with the step's parity, not with the fetched copies.
  // (Held in memory: after a restart the copy is an ordinary cached one until
  // the next loss repairs its group again.)
  void KeepAsStandIn(const std::string& job, uint64_t step, uint32_t rank);
  // Drops this node's replicas and cached copies of `job` that retention no
  // longer keeps.
  void CollectGarbage(const std::string& job);
  // Which steps of a job the peer tier keeps (its replicas, and parity).
  struct PeerRetention {
    uint64_t newest = 0;           // committed at any tier
    uint64_t newest_on_peers = 0;  // committed at tier peer
    std::vector<uint64_t> steps;   // the newest committed, and the resume step
    std::vector<uint64_t> on_peers;  // the same at tier peer
    // Replicas and parity: the newest `keep_steps` committed at tier peer,
    // the resume step, and newer steps (still gathering their copies).
    bool KeepsHeld(uint64_t step) const;
    // Fetched copies: any step retention keeps, and newer ones.
    bool KeepsFetched(uint64_t step) const;
  };
  // nullopt while nothing of the job is committed (everything is in flight).
  absl::StatusOr<absl::optional<PeerRetention>> Retention(
      const std::string& job);
  // Rebuilds a shard's file when no peer has a copy (the erasure-coded peer
  // tier); Fetch verifies and keeps what it returns like any fetched copy.
  // The shard asked for first, then others of its group rebuilt with it
  // (kept as fetched copies too: the next restore of one, here or on a node
  // that asks this one, needs no decoding).
  // It writes each file through the writer `sink` gives for its rank.
  using RebuildWriter = std::function<absl::Status(
      uint64_t offset, absl::Span<const uint8_t> bytes)>;
  using RebuildSink = std::function<absl::StatusOr<RebuildWriter>(
      uint32_t rank, uint64_t bytes)>;
  using Rebuilder = std::function<absl::StatusOr<std::vector<uint32_t>>(
      const std::string& job, uint64_t step, uint32_t rank,
      const RebuildSink& sink)>;
  void SetRebuilder(Rebuilder rebuild);
  // A channel to a peer (one per address, reused). With mutual TLS the
  // peer's certificate must name the node that published `address`.
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);
  // The cap on this node's sends to peers (null: none).
  io::RateLimiter* send_rate() const { return options_.send_rate.get(); }
  // Who is in the cluster (the peer service checks callers against it).
  PeerDirectory* directory() { return &directory_; }

  ReplicaStore* held() { return held_.get(); }
  ReplicaStore* fetched() { return fetched_.get(); }
  const ReplicationOptions& options() const { return options_; }
  // Shards waiting for peers (for tests and `ckpt status`).
  size_t pending() const;

 private:
  struct Pending {
    proto::ShardRecord shard;
    std::vector<std::string> holders;
    int attempts = 0;
  };
  Replicator(io::FileSystem* fs, ReplicationOptions options,
             Coordinator* coordinator, Metrics* metrics,
             OnReplicated on_replicated, OnPeersLost on_peers_lost,
             OnPeerReach on_peer_reach);
  void Loop();
  // Pushes `p` to peers until K hold it; true when done (or hopeless: its
  // file is gone).
  // Peers found unreachable in this round are skipped for the rest of it
  // (`unreachable`), so a backlog never waits seconds per shard on a peer
  // that restarted elsewhere: the next round asks for the peer list again.
  bool Replicate(Pending& p, const std::vector<proto::PeerInfo>& peers,
                 std::set<std::string>& unreachable);
  // A backlog of more than kBacklogSteps steps of a job is thinned
  // (replication_backlog.h): returns what to push this round; shards of
  // newer steps go to `later`, those of older ones are dropped.
  static constexpr size_t kBacklogSteps = 4;
  std::vector<Pending> ThinBacklog(std::vector<Pending> work,
                                   std::vector<Pending>* later);
  absl::Status Push(const proto::ShardRecord& shard,
                    const proto::PeerInfo& peer);
  // What Push sends `peer`: the shard's own file when it is an increment
  // whose bases the peer holds byte for byte (`increment` set: only the
  // chunks it stores travel), else its self-contained form.
  absl::StatusOr<snapshot::SelfContained> Outgoing(
      const proto::ShardRecord& shard, const proto::PeerInfo& peer,
      bool* increment);
  // Counts a push's bytes.
  void Sent(const proto::ShardRecord& shard, uint64_t bytes, bool increment);
  struct Candidate {
    const proto::PeerInfo* peer;
    proto::Tier tier;
  };
  // The peers among `peers` that have a copy of `key`, memory before disk;
  // appends every peer asked to `asked`, and those that did not answer to
  // `unreachable` (if given).
  std::vector<Candidate> PeersWith(
      const ReplicaStore::Key& key, const std::vector<proto::PeerInfo>& peers,
      std::vector<std::string>* asked,
      std::vector<std::string>* unreachable = nullptr);
  // Why no peer has a copy of `key` when some node that may hold one is
  // restarting: a live peer that did not answer (`unreachable`: its lease
  // outlives its process), or a node lost less than `reprotect_delay` ago
  // (the cluster waits that long for it to come back). Unavailable naming
  // them, for a restore to wait on; OK when there is none.
  // `peers`: the live peers now; a node the pushing thread last saw live
  // that is not among them was lost moments ago (awaited too).
  absl::Status Restarting(const std::string& what,
                          const std::vector<std::string>& unreachable,
                          const std::vector<proto::PeerInfo>& peers);
  absl::StatusOr<proto::LocateShardResponse> LocateOn(
      const proto::PeerInfo& peer, const ReplicaStore::Key& key,
      bool with_items);
  // Whether `peer` already holds a verified replica of `shard` (a restarted
  // peer kept its replicas on tmpfs): it counts without being sent again.
  bool Holds(const proto::ShardRecord& shard, const proto::PeerInfo& peer);
  // A bulk transfer when the peer offers one, else a gRPC stream; `via`
  // says which.
  absl::StatusOr<ReplicaStore::Entry> FetchFrom(const ReplicaStore::Key& key,
                                                const proto::PeerInfo& peer,
                                                std::string* via);
  // Room in the fetched-copies cache, made by dropping copies no restore
  // reads now when it is full.
  absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>> ReceiveFetched(
      const ReplicaStore::Key& key, uint64_t bytes, bool mapped = true);
  // Notes that a restore is about to read a fetched copy.
  void Used(const ReplicaStore::Key& key);
  // Whether a fetched copy was handed out less than `grace` ago.
  bool InUse(const ReplicaStore::Key& key, absl::Duration grace) const;
  // The live peers other than this node; publishes this node when missing.
  absl::StatusOr<std::vector<proto::PeerInfo>> Peers();
  // Fetch's steps: a copy on this node already; one fetched from the first
  // peer with a good copy (DataLoss naming each peer's failure otherwise).
  absl::optional<proto::ShardRecord> CopyHere(const ReplicaStore::Key& key);
  absl::StatusOr<proto::ShardRecord> FetchFromPeers(
      const ReplicaStore::Key& key);
  // Fetch's last resort: the shard rebuilt (erasure-coded peer tier).
  absl::StatusOr<proto::ShardRecord> Rebuilt(const ReplicaStore::Key& key);

  io::FileSystem* const fs_;
  const ReplicationOptions options_;
  Coordinator* const coordinator_;
  Metrics* const metrics_;
  const OnReplicated on_replicated_;
  const OnPeersLost on_peers_lost_;
  const OnPeerReach on_peer_reach_;
  // The pushing thread's last view: node id -> incarnation.
  std::map<std::string, std::string> known_peers_;
  // Losses seen whose re-protection waits for `reprotect_delay`: node -> when
  // it was seen lost (the loop's thread only).
  std::map<std::string, absl::Time> lost_since_;
  const std::string incarnation_;  // this start's
  PeerDirectory directory_;
  std::unique_ptr<ReplicaStore> held_;
  std::unique_ptr<ReplicaStore> fetched_;
  // Fetches of different shards run at once (a publish of a job on several
  // nodes, the ranks of a restore); a second fetch of a shard waits for the
  // first and finds its copy.
  absl::Mutex fetch_mu_;
  absl::CondVar fetch_done_;
  std::set<ReplicaStore::Key> fetching_ ABSL_GUARDED_BY(fetch_mu_);
  // Held shared by fetches from peers, alone by a rebuild from parity (it
  // writes the copies of a group's other ranks too).
  absl::Mutex rebuild_mu_;
  // Marks `key` as being fetched for its lifetime, once no other fetch of it
  // runs.
  class FetchingKey;

  mutable absl::Mutex mu_;
  // lost_since_'s nodes not back yet, for Restarting (other threads).
  std::map<std::string, absl::Time> awaited_ ABSL_GUARDED_BY(mu_);
  // The peers the pushing thread last saw live.
  std::set<std::string> last_seen_ ABSL_GUARDED_BY(mu_);
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<io::BulkServer> bulk_ ABSL_GUARDED_BY(mu_);
  Rebuilder rebuild_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(mu_);
  // When each fetched copy was last handed to a restore: a copy stays a
  // while after that, whatever retention says, so that the restore that asked
  // for it can open it.
  std::map<ReplicaStore::Key, absl::Time> fetched_used_ ABSL_GUARDED_BY(mu_);
  std::set<ReplicaStore::Key> stand_ins_ ABSL_GUARDED_BY(mu_);
  bool StandIn(const ReplicaStore::Key& key) const;
  std::thread thread_;
};

// The text of a PEM file; the error names a file that is missing or no PEM.
absl::StatusOr<std::string> ReadPeerTlsFile(const std::string& file);
// Builds channel credentials for mutual TLS from PEM files (the CA that signed
// the peers' certificates, this node's certificate and key); every file is
// read here and a missing one is named.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerTlsCredentials(
    const std::string& ca_file, const std::string& cert_file,
    const std::string& key_file);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_REPLICATOR_H_
