// The parity plan of a step in the erasure-coded peer tier (DESIGN.md §2, T1
// with `--peer-redundancy rs:K+M`): which shard files form each parity group
// and which nodes hold each group's parity blocks. It is a pure function of
// the step's shard holders and the live nodes (but for the time it records),
// so any node computes the same plan; the coordinator keeps the first one made
// (Coordinator::SettleParityPlan) so that a retry or a later membership change
// never splits a step's groups.
//
// Rules: the data blocks of a group lie on distinct nodes, and its parity
// blocks on m further nodes, so that losing any m nodes loses at most m blocks
// of any group. Nodes are taken from distinct failure domains first. A group
// has k data blocks unless fewer nodes are there: with n nodes, groups have at
// most n-m (a group of one is m full copies). Parity holders are the nodes
// holding the least parity so far, so parity memory spreads evenly.
#ifndef CKPT_DAEMON_PEER_PARITY_PLAN_H_
#define CKPT_DAEMON_PEER_PARITY_PLAN_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/peer.pb.h"

namespace ckpt::daemon {

// Plans `job` step `step` for rs:k+m. `holders`: one per rank of the world
// (0..world_size-1, in any order). `nodes`: the live nodes and their failure
// domains (holders' nodes count as live too). InvalidArgument names a rank
// without holder or with two; FailedPrecondition says how many nodes rs:k+m
// needs when there are too few (m+1).
absl::StatusOr<proto::ParityPlan> PlanParity(
    const std::string& job, uint64_t step, int k, int m, uint32_t world_size,
    const std::vector<proto::ShardHolder>& holders,
    const std::vector<proto::PeerInfo>& nodes);

// Where a rank's shard lies in a plan.
struct ParityPosition {
  const proto::ParityGroup* group = nullptr;
  int index = -1;  // data block index in the group
};
// NotFound when the plan has no such rank.
absl::StatusOr<ParityPosition> FindInPlan(const proto::ParityPlan& plan,
                                          uint32_t rank);

// Who holds each parity block of `group` now, given the live nodes: its
// planned node while that one is live, else a replacement (re-protection
// after a loss): the live nodes outside the group, by id, taken in turn for
// the blocks whose planned node is gone. "" when no node is left for a block.
// Every node computes the same from the same live set.
std::vector<std::string> ParityHolders(const proto::ParityGroup& group,
                                       const std::set<std::string>& live);

// The key of parity block `index` of `group` of a step.
proto::ParityBlockKey BlockKey(const std::string& job, uint64_t step,
                               const proto::ParityGroup& group, uint32_t index);

// Per data block of `group`, the live node that rebuilds it when its node is
// lost and keeps a copy in its place, so that the group again survives m
// losses: the live nodes with no block of the group (after those
// ParityHolders takes), by id, in turn; failing those, its parity holders.
// "" for a block whose node is live, or when no node is left. Every node
// computes the same from the same live set.
std::vector<std::string> DataStandIns(const proto::ParityGroup& group,
                                      const std::set<std::string>& live);

// The bytes of parity the plan puts on nodes, all groups together.
uint64_t ParityBytes(const proto::ParityPlan& plan);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_PARITY_PLAN_H_
