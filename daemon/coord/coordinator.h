// Coordinator decides when a step is committed: a step of a job is committed at
// a tier when every rank of its world has voted that its shard reached that
// tier. A commit record is durable before Vote() returns and never reverts, and
// the latest committed step of a tier never goes backward. Key layout
// (DESIGN.md §5), shared by every backend:
//   /ckpt/<job>/steps/<step:020>/votes/<rank:010>    VoteRecord
//   (etcd also indexes the votes, so a vote counts them without reading
//   them: .../reached/<tier>/<rank:010> per tier a rank reached, and
//   .../worlds/<world size:010> per world size voted with.)
//   /ckpt/<job>/steps/<step:020>/commit/<tier>       CommitRecord
//   /ckpt/<job>/latest/<tier>                        the latest committed step
//   /ckpt/cluster/seal-key                           ClusterKeyRecord
// Backends: EmbeddedCoordinator (one node, in ckptd's RocksDB) and
// EtcdCoordinator (many nodes; leases and fencing).
//
// Thread-safety: implementations are thread-safe.
#ifndef CKPT_DAEMON_COORD_COORDINATOR_H_
#define CKPT_DAEMON_COORD_COORDINATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "proto/catalog.pb.h"
#include "proto/peer.pb.h"
#include "proto/publish.pb.h"
#include "snapshot/manifest_seal.h"

namespace ckpt::daemon {

class Coordinator {
 public:
  virtual ~Coordinator() = default;

  // Records that `rank`'s shard of `step` reached `tiers` (added to what it
  // voted before). Returns the tiers at which the step is committed after this
  // vote.
  virtual absl::StatusOr<std::vector<proto::Tier>> Vote(
      const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
      const std::vector<proto::Tier>& tiers) = 0;
  // Vote of several of this node's ranks of one step, every one reaching
  // `tiers`: one round trip where the backend allows (etcd: a transaction
  // per kVoteBatch ranks). Returns the tiers the step is committed at after
  // them. The default votes one rank at a time.
  virtual absl::StatusOr<std::vector<proto::Tier>> VoteMany(
      const std::string& job, uint64_t step, const std::vector<uint32_t>& ranks,
      uint32_t world_size, const std::vector<proto::Tier>& tiers);
  virtual absl::StatusOr<absl::optional<proto::CommitRecord>> GetCommit(
      const std::string& job, uint64_t step, proto::Tier tier) = 0;
  virtual absl::StatusOr<absl::optional<uint64_t>> LatestCommitted(
      const std::string& job, proto::Tier tier) = 0;
  // Every commit record of the job, by step then tier.
  virtual absl::StatusOr<std::vector<proto::CommitRecord>> ListCommits(
      const std::string& job) = 0;
  // The steps newer than `after` that some rank voted reached `tier` (a
  // replicator that fell behind follows the steps the others replicated).
  virtual absl::StatusOr<std::set<uint64_t>> StepsVotedAt(
      const std::string& job, proto::Tier tier, uint64_t after) = 0;
  // Takes back `rank`'s vote for a step that is not committed at any tier (its
  // shard is being replaced by a new save of the same step). Refused with
  // AlreadyExists once the step is committed anywhere: a commit never reverts.
  // The rank's holder record (HolderKey) goes with the vote.
  virtual absl::Status WithdrawVote(const std::string& job, uint64_t step,
                                    uint32_t rank) = 0;
  // The steps newer than `after` that `rank` has a vote for, whichever node
  // cast it (a rank resuming from `after` withdraws them all, also those of
  // a node that lost its catalog since: DESIGN.md §5).
  absl::StatusOr<std::set<uint64_t>> StepsVotedBy(const std::string& job,
                                                  uint32_t rank,
                                                  uint64_t after);
  // Drops the votes and commit records of a step (garbage collection). Refused
  // for a step that is the latest committed one at any tier.
  virtual absl::Status ForgetStep(const std::string& job, uint64_t step) = 0;
  // An operator's rollback, atomically: drops the votes and commit records of
  // every step newer than `step`, points each tier's latest step back to the
  // newest step <= `step` committed there, and stores `record` under
  // /ckpt/<job>/rollbacks/. The only way the latest step goes backward.
  virtual absl::Status RollBack(const std::string& job, uint64_t step,
                                const proto::RollbackRecord& record) = 0;

  // The nodes alive now (holding a lease), and the revision that state is
  // at. With `after_revision` > 0, first waits (up to `timeout`) until the
  // membership changed after it; on timeout returns the unchanged state.
  struct Membership {
    std::vector<std::string> nodes;  // sorted
    int64_t revision = 0;
  };
  virtual absl::StatusOr<Membership> WatchMembers(int64_t after_revision,
                                                  absl::Duration timeout) = 0;

  // A node that joined (registered, or took a new lease) or left (its
  // membership key went: its lease expired, or it stopped and revoked it),
  // with the jobs it served then (SetServedJobs).
  struct MemberChange {
    std::string node;
    bool joined = false;
    int64_t lease = 0;  // of the membership that began or ended
    std::vector<std::string> jobs;
  };
  // The membership changes after `*revision` (0: from now on), waiting up
  // to `timeout` for the first; advances `*revision` past those returned.
  // Unimplemented for the embedded backend (one node: none ever leaves).
  virtual absl::StatusOr<std::vector<MemberChange>> WatchMemberChanges(
      int64_t* revision, absl::Duration timeout);
  // The jobs whose trainers this node serves now, kept with its membership
  // (etcd) for the nodes that see it leave. The embedded backend keeps
  // nothing.
  virtual absl::Status SetServedJobs(const std::vector<std::string>& jobs);
  // Claims the end of `node`'s membership under `lease` for `claimer`,
  // under /ckpt/cluster/departures/<node>/<lease>: true for the first claim
  // only, so that a departure is counted once in the cluster. A node that
  // stops cleanly claims its own first (it was not lost).
  absl::StatusOr<bool> ClaimDeparture(const std::string& node, int64_t lease,
                                      const std::string& claimer);
  // Drops the departure claims of `node` (a node starting: its earlier
  // departures were seen by then).
  absl::Status ForgetDepartures(const std::string& node);

  // Elastic restart: `participant` joins the job's next epoch. The epoch
  // closes once `max_members` joined, or once at least `min_members` joined
  // and nobody else did for `settle`; the closer writes the members (sorted:
  // the rank order), a fresh 128-byte NCCL unique id and the step the epoch
  // resumes from (the newest committed at `resume_tier` then), created only if
  // absent. A participant that arrives after an epoch closed without it joins
  // the one after. DeadlineExceeded after `timeout`.
  absl::StatusOr<proto::EpochRecord> Rendezvous(
      const std::string& job, const std::string& participant,
      uint32_t min_members, uint32_t max_members, absl::Duration settle,
      absl::Duration timeout, proto::Tier resume_tier = proto::TIER_PEER);

  // The step the job's current epoch resumes from (its closed record's
  // resume_step; nullopt: no epoch, or none to resume from). Retention keeps
  // it on every tier while the epoch lasts: its members may still be
  // restoring it while the old epoch's last steps commit.
  absl::StatusOr<absl::optional<uint64_t>> ResumeStep(const std::string& job);

  // How many times this node took a new lease after losing one (etcd; 0 for
  // the embedded backend). Votes made while it had none failed: the service
  // makes them again when this number changes.
  virtual int Rejoins() const { return 0; }

  // Peer replication (tier T1): publishes where this node's peer service
  // listens, under /ckpt/peers/<node> (with etcd, for as long as its lease
  // lives), and lists the nodes that published one (with etcd: the live ones).
  absl::Status PublishPeer(const proto::PeerInfo& info);
  absl::StatusOr<std::vector<proto::PeerInfo>> ListPeers();

  // Erasure-coded peer tier (rs:K+M): where each rank's persisted shard of
  // a step lies, put by its node under
  // /ckpt/<job>/steps/<step>/parity/holders/<rank> (a re-save overwrites it),
  // and the step's parity plan (parity_plan.h). All go with the step.
  absl::Status PublishShardHolder(const std::string& job, uint64_t step,
                                  const proto::ShardHolder& holder);
  absl::StatusOr<std::vector<proto::ShardHolder>> ListShardHolders(
      const std::string& job, uint64_t step);
  // Keeps `plan` unless its step has a plan already; returns the step's plan
  // (the one kept first), so every node and every retry agree.
  absl::StatusOr<proto::ParityPlan> SettleParityPlan(
      const proto::ParityPlan& plan);
  absl::StatusOr<absl::optional<proto::ParityPlan>> GetParityPlan(
      const std::string& job, uint64_t step);
  // Every step's plan, of every job (one scan; after a loss, to find the
  // groups that lost data).
  absl::StatusOr<std::vector<proto::ParityPlan>> ListParityPlans();

  // The cluster's key for sealing manifests, when ckptd is given none: the
  // record kept first, so every node agrees. A node that finds none keeps
  // `fresh_key` (random, at least 32 bytes), naming itself `node`, with the
  // newest step of each job that has a vote or commit record now (those
  // steps stay readable unsealed).
  absl::StatusOr<proto::ClusterKeyRecord> AgreeClusterKey(
      const std::string& fresh_key, const std::string& node);
  // The cluster's key if one was made (what `ckpt verify` checks seals
  // with).
  absl::StatusOr<absl::optional<proto::ClusterKeyRecord>> GetClusterKey();

  // Silent data corruption across replicas (health/replica_check.h): each
  // rank's digests of a step under /ckpt/<job>/steps/<step>/digests/<rank>
  // (a re-save replaces them), and the step's comparison under
  // .../replicas, kept once (the first one kept is returned). All go with
  // the step.
  absl::Status PutReplicaDigests(const std::string& job, uint64_t step,
                                 const proto::ReplicaDigests& digests);
  absl::StatusOr<std::vector<proto::ReplicaDigests>> ListReplicaDigests(
      const std::string& job, uint64_t step);
  absl::StatusOr<proto::ReplicaCheck> SettleReplicaCheck(
      const proto::ReplicaCheck& check);
  absl::StatusOr<absl::optional<proto::ReplicaCheck>> GetReplicaCheck(
      const std::string& job, uint64_t step);
  // The newest step committed at `tier` whose replicas were not found to
  // disagree: what a job resumes from unless asked for a suspect step
  // (nullopt: none).
  absl::StatusOr<absl::optional<uint64_t>> LatestTrusted(const std::string& job,
                                                         proto::Tier tier);
  // Publication (publish.proto): a topic's versions, each created once under
  // /ckpt/@topics/<topic>/versions/<version> ('@' is in no job id), the
  // newest also under /ckpt/@topics/<topic>/newest; the newest
  // kVersionRecordsKept records are kept, older ones removed. Keeps
  // `record` as the topic's next version, above every version kept (a race
  // with another publisher takes the one after); returns it numbered.
  absl::StatusOr<proto::VersionRecord> AddVersion(proto::VersionRecord record);
  static constexpr uint64_t kVersionRecordsKept = 32;
  // The newest version of `topic` (one read: what subscribers poll);
  // nullopt when it has none.
  absl::StatusOr<absl::optional<proto::VersionRecord>> NewestVersion(
      const std::string& topic);
  // Returns once `topic` may have a version above `after` (the caller reads
  // it), or after `timeout`. etcd watches for it (a subscriber learns of a
  // version as it is made, at no cost while none is); the default polls.
  virtual absl::Status WaitForVersionAfter(const std::string& topic,
                                           uint64_t after,
                                           absl::Duration timeout);
  // The versions of `topic` kept, oldest first (none: empty).
  absl::StatusOr<std::vector<proto::VersionRecord>> ListVersions(
      const std::string& topic);
  // The topics with a version.
  absl::StatusOr<std::vector<std::string>> ListTopics();
  // A node subscribed to a topic, under
  // /ckpt/@topics/<topic>/subscribers/<node> (with etcd, while its lease
  // lives); the record replaces the node's last one.
  absl::Status PutSubscriber(const proto::SubscriberRecord& record);
  // The subscribers of `topic`, by node id.
  absl::StatusOr<std::vector<proto::SubscriberRecord>> ListSubscribers(
      const std::string& topic);

 protected:
  // The key version `version` of `topic` is created under.
  static std::string VersionKey(const std::string& topic, uint64_t version);
  // Records `record` as the topic's newest version.
  absl::Status RecordNewest(const proto::VersionRecord& record);
  // Per job, the newest step with any record.
  absl::StatusOr<std::map<std::string, uint64_t>> NewestStepOfEachJob();

  // The few store operations the rendezvous needs, in each backend's store.
  virtual absl::StatusOr<absl::optional<std::string>> StoreGet(
      const std::string& key) = 0;
  // The keys under `prefix` (without it) and their values, in key order.
  virtual absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
  StoreScan(const std::string& prefix) = 0;
  // The keys alone.
  absl::StatusOr<std::vector<std::string>> StoreKeys(const std::string& prefix);
  // `ephemeral`: the key goes when this node's lease does (etcd).
  virtual absl::Status StorePut(const std::string& key,
                                const std::string& value, bool ephemeral) = 0;
  // Creates `key` unless it exists (and, for etcd, only while this node holds
  // its lease); true if it was created.
  virtual absl::StatusOr<bool> StoreCreate(const std::string& key,
                                           const std::string& value) = 0;
  // Removes `key` (for etcd, only while this node holds its lease); OK when
  // it is not there.
  virtual absl::Status StoreDelete(const std::string& key) = 0;

 private:
  // AddVersion's last step: the records of `topic` older than the newest
  // kVersionRecordsKept go (`kept`: those listed before `newest` was made).
  void ForgetOldVersions(const std::string& topic,
                         const std::vector<proto::VersionRecord>& kept,
                         uint64_t newest);
};

// Key helpers shared by the backends.
std::string StepPrefix(const std::string& job, uint64_t step);
std::string VoteKey(const std::string& job, uint64_t step, uint32_t rank);
// The votes' index (etcd): the ranks that reached a tier, and the world sizes
// voted with.
std::string ReachedPrefix(const std::string& job, uint64_t step,
                          proto::Tier tier);
std::string ReachedKey(const std::string& job, uint64_t step, proto::Tier tier,
                       uint32_t rank);
std::string WorldsPrefix(const std::string& job, uint64_t step);
std::string WorldKey(const std::string& job, uint64_t step, uint32_t world);
// Where `rank`'s shard of the step lies (the erasure-coded peer tier):
// withdrawing the rank's vote takes it back too.
std::string HolderKey(const std::string& job, uint64_t step, uint32_t rank);
std::string CommitKey(const std::string& job, uint64_t step, proto::Tier tier);
std::string LatestKey(const std::string& job, proto::Tier tier);
std::string RollbackKey(const std::string& job, int64_t unix_micros);
// "/ckpt/<job>/steps/"
std::string StepsPrefix(const std::string& job);
// The step of a key under StepsPrefix; false if it is none.
bool StepOfKey(absl::string_view key, uint64_t* step);
// Every tier, fastest first.
inline constexpr proto::Tier kAllTiers[] = {
    proto::TIER_MEMORY, proto::TIER_PEER, proto::TIER_LOCAL_DISK,
    proto::TIER_SHARED};

// Shared by the backends' Vote: the arguments are valid (job id, rank inside
// the world, known tiers).
absl::Status ValidateVote(const std::string& job, uint64_t step, uint32_t rank,
                          uint32_t world_size,
                          const std::vector<proto::Tier>& tiers);
// How many of `votes` include `tier`.
size_t VotesReaching(const std::vector<proto::VoteRecord>& votes,
                     proto::Tier tier);
// The record of a commit happening now.
proto::CommitRecord NewCommitRecord(const std::string& job, uint64_t step,
                                    proto::Tier tier, uint32_t world_size);

// "memory", "peer", "local_disk", "shared".
std::string TierName(proto::Tier tier);
absl::StatusOr<proto::Tier> ParseTier(absl::string_view name);

// The keys a cluster key record seals and checks with: its key, and the
// steps saved before it that stay readable unsealed.
absl::StatusOr<std::shared_ptr<const snapshot::SealKeys>> SealKeysOf(
    const proto::ClusterKeyRecord& record);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_COORD_COORDINATOR_H_
