// Elastic restart for trainers: Rejoin() is the rendezvous of a job's next
// epoch through the node's ckptd and the coordination store (etcd for many
// nodes). Survivors of a failure and replacement nodes call it; it returns
// each one's new rank and world size and a fresh NCCL unique id they share.
// The trainer then connects a Checkpointer with the new rank and world size
// and restores the epoch's resume_step (resharded if the world changed): the
// newest step committed at the resume tier when the epoch closed, the same for
// every member. After a node loss that tier is the peer tier (the default):
// newer steps may be committed in memory, but the lost node's memory is gone.
// A committed step is
// never replaced, so the new epoch must save under step ids no older epoch
// used (e.g. epoch * 1000000 + iteration, with the iteration in a byte item).
//
// Thread-safety: Rejoin is thread-safe.
#ifndef CKPT_CLIENT_ELASTIC_H_
#define CKPT_CLIENT_ELASTIC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "proto/catalog.pb.h"

namespace ckpt::client {

struct RejoinOptions {
  std::string job;
  std::string socket_path;  // default: ckptd's default socket
  // Unique per process across the job (default: <hostname>-<pid>); the rank
  // order is the sorted order of these ids.
  std::string participant;
  uint32_t min_ranks = 1;
  uint32_t max_ranks = 1;
  // The epoch closes once max_ranks joined, or min_ranks and nobody else
  // joined for this long.
  absl::Duration settle = absl::Seconds(2);
  absl::Duration timeout = absl::Minutes(5);
  // The epoch resumes from the newest step committed at this tier when it
  // closes (every member should pass the same). After a node loss: the peer
  // tier (or shared); a one-node job: memory or local disk.
  proto::Tier resume_tier = proto::TIER_PEER;
};

struct Epoch {
  uint64_t epoch = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  std::string nccl_unique_id;  // 128 bytes, the size of ncclUniqueId
  std::vector<std::string> members;
  // The step every member restores (Checkpointer::Restore), fixed when the
  // epoch closed; nullopt: nothing was committed at the resume tier then, the
  // job starts afresh. Steps of the old epoch that commit later are not used:
  // restoring the newest one instead could make members restore different
  // steps.
  absl::optional<uint64_t> resume_step;
};

absl::StatusOr<Epoch> Rejoin(const RejoinOptions& options);

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_ELASTIC_H_
