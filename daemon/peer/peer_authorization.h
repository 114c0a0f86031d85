// PeerAuthorization says what a peer may put on this node, past the peer
// service's admission (a node of the cluster, known by the names its
// certificate gives; without TLS, nobody is known and only the plan checks
// apply):
//  - A parity contribution must be what the step's settled parity plan says
//    (the coordinator's, not the sender's word): the group as planned, and
//    from the node that holds the data block it contributes. A peer cannot
//    spoil a parity block of a group it has no shard in.
//  - A replica is refused for a shard this node holds itself (a node never
//    needs another's copy of its own shard, and would serve it before its
//    own), and a replica held from one node is replaced only by that node.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_PEER_PEER_AUTHORIZATION_H_
#define CKPT_DAEMON_PEER_PEER_AUTHORIZATION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"
#include "daemon/peer/replica_store.h"
#include "proto/peer.pb.h"

namespace ckpt::daemon {

class PeerAuthorization {
 public:
  // The settled parity plan of a step (nullopt: none yet).
  using PlanOf =
      std::function<absl::StatusOr<absl::optional<proto::ParityPlan>>(
          const std::string& job, uint64_t step)>;
  // Whether this node holds the shard itself (its slot or its shard file).
  using HoldsOwn = std::function<absl::StatusOr<bool>(
      const std::string& job, uint64_t step, uint32_t rank)>;

  // `plan_of` may be null (no erasure-coded tier here).
  PeerAuthorization(PlanOf plan_of, HoldsOwn holds_own);

  // A contribution to parity block `key` as data block `position` of
  // `group`, from a caller whose certificate names `callers` (empty: not
  // authenticated). PermissionDenied names what differs from the plan;
  // FailedPrecondition while the step has no plan here yet.
  absl::Status MayContribute(const proto::ParityBlockKey& key,
                             const proto::ParityGroup& group, uint32_t position,
                             const std::vector<std::string>& callers);

  // A push of a replica of `key` from one node, in flight while the claim
  // lives: another node's push of it is refused meanwhile.
  class ReplicaClaim {
   public:
    ReplicaClaim(ReplicaClaim&& other) noexcept
        : auth_(std::exchange(other.auth_, nullptr)), key_(other.key_) {}
    ReplicaClaim& operator=(ReplicaClaim&&) = delete;
    ~ReplicaClaim();

   private:
    friend class PeerAuthorization;
    ReplicaClaim(PeerAuthorization* auth, ReplicaStore::Key key)
        : auth_(auth), key_(std::move(key)) {}
    PeerAuthorization* auth_;
    ReplicaStore::Key key_;
  };
  // A replica of `key` sent by node `from` (as the call names it, already
  // matched to the certificate when there is one), claimed for the push.
  // PermissionDenied when this node holds the shard itself, holds a replica
  // of it from another node, or another node's push of it is in flight.
  absl::StatusOr<ReplicaClaim> ClaimReplica(const ReplicaStore::Key& key,
                                            const std::string& from,
                                            const ReplicaStore& held);
  // Records `from` as the sender of the replica of `key` now held.
  void Held(const ReplicaStore::Key& key, const std::string& from,
            const ReplicaStore& held);

 private:
  absl::StatusOr<proto::ParityPlan> Plan(const std::string& job, uint64_t step);

  const PlanOf plan_of_;
  const HoldsOwn holds_own_;
  absl::Mutex mu_;
  // Settled plans do not change: kept (at most kPlansKept, the first in key
  // order dropped first).
  static constexpr size_t kPlansKept = 256;
  std::map<std::tuple<std::string, uint64_t>, proto::ParityPlan> plans_
      ABSL_GUARDED_BY(mu_);
  std::map<ReplicaStore::Key, std::string> senders_ ABSL_GUARDED_BY(mu_);
  // Pushes in flight, by key: the sending node and how many of its pushes.
  std::map<ReplicaStore::Key, std::pair<std::string, int>> pushing_
      ABSL_GUARDED_BY(mu_);
  // senders_ is pruned of replicas no longer held when it grows to this.
  size_t prune_at_ ABSL_GUARDED_BY(mu_) = 1024;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_PEER_AUTHORIZATION_H_
