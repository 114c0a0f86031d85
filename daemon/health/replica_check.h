// Silent data corruption across replicas: state that data parallelism
// replicates (a DTensor's Replicate placements, a DDP model's parameters:
// every tensor box two or more ranks save with the same coordinates) must be
// bit-identical on every rank that saves it. Each rank's shard is summed up
// as one digest per tensor box, from the chunk checksums the save computes
// anyway (the trainer's copy, else the persist): no byte is read again. The
// digests of a step's ranks are compared once all are known; a box whose
// replicas disagree makes the step suspect and names the ranks (and nodes)
// outside the majority, or every replica when there is no majority.
//
// Pure functions; the service posts and compares through the coordinator
// (service/checkpoint_service_replicas.cc).
#ifndef CKPT_DAEMON_HEALTH_REPLICA_CHECK_H_
#define CKPT_DAEMON_HEALTH_REPLICA_CHECK_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/types/optional.h"
#include "proto/catalog.pb.h"
#include "proto/manifest.pb.h"

namespace ckpt::daemon {

// The digests of a staged shard's tensor boxes, from the chunk hashes its
// trainer took (StagedItem.chunk_xxh3); nullopt when a tensor was not hashed
// (the persist's manifest gives them then). Rank-local tensors
// (StagedItem.rank_local) have none.
absl::optional<proto::ReplicaDigests> DigestsOfStaged(
    const proto::ShardRecord& shard, const std::string& node);

// The digests of a persisted shard's tensor boxes, from its manifest's chunk
// checksums, but for the items `skip` names (rank-local ones).
proto::ReplicaDigests DigestsOfManifest(const proto::ShardManifest& manifest,
                                        const std::string& node,
                                        const std::set<std::string>& skip = {});

// Compares the replicas among `ranks` (one record per rank of the step).
proto::ReplicaCheck CompareReplicas(
    const std::string& job, uint64_t step,
    const std::vector<proto::ReplicaDigests>& ranks);

// "item \"w\" on rank 3 (node b) disagrees with ranks 0, 1" lines of a
// suspect check, for logs and errors.
std::string DescribeMismatches(const proto::ReplicaCheck& check);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_HEALTH_REPLICA_CHECK_H_
