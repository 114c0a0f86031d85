// Retention: which copies of a job's shards garbage collection may drop, as a
// pure function of the commit records and the catalog, so that ckptd and
// `ckpt gc --dry-run` apply exactly the same rules:
//  - nothing is dropped before some step is committed on disk, and nothing
//    that is not persisted yet (STAGING, STAGED) unless its persist was
//    skipped for a newer save of its rank (persist_skipped: its slot goes
//    by the memory rule below);
//  - shard files go only for steps older than the oldest of the newest
//    `keep_disk` disk commits, so the latest committed step and the one before
//    it stay until newer ones are committed;
//  - a staging slot stays for the newest `keep_memory` memory commits and for
//    steps newer than every commit (they may still be committed); it leaves
//    as soon as a newer step is committed in memory;
//  - with a peer tier, the files of the newest peer-committed step stay, and
//    those of every newer step: the peer tier may still commit it, and then a
//    node's loss must find this node's own copy (its replica may be on the
//    lost node);
//  - the file of a shard that a kept shard (or a persist in flight) stores
//    unchanged chunks in stays as long as that one does (incremental saves);
//  - a shard with neither copy left is forgotten, and a step with no shard
//    left older than the kept disk commits loses its commit records.
//
// Thread-safety: pure functions, callable from any thread.
#ifndef CKPT_DAEMON_PERSIST_RETENTION_H_
#define CKPT_DAEMON_PERSIST_RETENTION_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "proto/catalog.pb.h"
#include "proto/daemon.pb.h"

namespace ckpt::daemon {

struct RetentionPolicy {
  int keep_disk_steps = 2;
  int keep_memory_steps = 1;
  // Peer replication is on: files of steps the peer tier may still commit
  // stay (see above).
  bool peer_tier = false;
  // (rank, step) of shards that persists in flight store chunks in: their
  // files stay, like those of every base a kept shard names (base_steps).
  std::set<std::pair<uint32_t, uint64_t>> pinned;
  // Steps an elastic epoch resumes from (Coordinator::ResumeStep): every copy
  // stays.
  std::set<uint64_t> resume_steps;
};

struct RetentionAction {
  proto::ShardRecord shard;  // as found
  bool drop_file = false;
  bool drop_slot = false;
  // Neither copy is left: the catalog forgets the shard.
  bool forget() const {
    return (drop_file || shard.shard_path().empty()) &&
           (drop_slot || shard.slot_path().empty());
  }
};

struct RetentionPlan {
  std::vector<RetentionAction> actions;
  // Steps below this may have their commit records forgotten once no shard of
  // theirs is left; 0 when nothing is committed on disk.
  uint64_t oldest_kept_disk_step = 0;
};

// Steps as the logs name them: sorted, runs collapsed ("3-7,9").
std::string StepList(const std::set<uint64_t>& steps);

// What `ckpt gc` prints for one action.
proto::DroppedCopy ToProto(const RetentionAction& action);

RetentionPlan PlanRetention(const std::vector<proto::CommitRecord>& commits,
                            const std::vector<proto::ShardRecord>& shards,
                            const RetentionPolicy& policy);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PERSIST_RETENTION_H_
