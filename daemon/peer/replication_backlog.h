// What a replicator that fell behind pushes next. Pushing every step in order
// when saves come faster than replicas land makes the peer tier lag further
// with every step (chaos: 900 steps behind after a minute), and disk keeps
// every step the peer tier may still commit. Only the newest step matters
// once a newer one commits, so a backlog is thinned: the replicator pushes
// one step and drops the older ones. Which one: the newest step some rank
// already replicated (voted TIER_PEER), so that nodes behind by different
// amounts converge on the same step and it commits; when none has, its own
// newest. Steps newer than the chosen one wait for the next round.
//
// Thread-safety: a pure function.
#ifndef CKPT_DAEMON_PEER_REPLICATION_BACKLOG_H_
#define CKPT_DAEMON_PEER_REPLICATION_BACKLOG_H_

#include <cstddef>
#include <cstdint>
#include <set>

namespace ckpt::daemon {

struct BacklogChoice {
  bool thinned = false;        // false: push everything, as enqueued
  uint64_t push = 0;           // the step pushed this round
  std::set<uint64_t> dropped;  // older steps: never pushed
  std::set<uint64_t> later;    // newer steps: the next round decides
};

// `waiting`: the steps of one job with shards waiting to be pushed that are
// newer than its latest commit at tier peer. `voted`: steps among them some
// rank voted TIER_PEER for. A backlog of at most `threshold` steps is pushed
// whole (a burst of saves still replicates every step).
BacklogChoice ChooseFromBacklog(const std::set<uint64_t>& waiting,
                                const std::set<uint64_t>& voted,
                                size_t threshold);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_REPLICATION_BACKLOG_H_
