// The shape a version spreads in to a topic's subscribers (issue #37): who
// each subscriber fetches it from, first and then when that one fails.
//
// The nodes are laid out as a tree, the source (the node that made the
// version) at its root and the subscribers after it in node-id order (node i
// fetches from node (i-1)/degree), and each node forwards every piece to the
// nodes below it as soon as it arrives. With degree 1 the tree is a chain:
// every node sends each byte once, so reaching N subscribers costs about one
// transfer plus N pieces' latency. A wider tree costs each node `degree`
// sends of every byte but only log(N) pieces of latency, which pays only when
// there are more subscribers than pieces: AutoDegree.
//
// When its parent fails (dead, too slow, bad bytes), a subscriber goes up the
// tree (the parent's parent, ..., the source), then to the other nodes that
// hold the version (spread by node, so late joiners do not all ask the same
// one), then to the other subscribers, which may be receiving it.
//
// Thread-safety: pure functions.
#ifndef CKPT_DAEMON_PUBLISH_FANOUT_H_
#define CKPT_DAEMON_PUBLISH_FANOUT_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace ckpt::daemon {

// The pieces a version travels in (a bulk send's and the send cap's unit).
inline constexpr uint64_t kFanoutPieceBytes = 1 << 20;

// 1 (a chain) while the subscribers are no more than the version's pieces,
// else 2.
int AutoDegree(size_t subscribers, uint64_t version_bytes);

struct FanoutNodes {
  std::string source;                    // the node that made the version
  std::vector<std::string> subscribers;  // any order; may include the source
  std::set<std::string> holders;         // nodes that hold it whole
};

// The nodes `self` asks for the version, in order (never itself).
std::vector<std::string> FetchOrder(const FanoutNodes& nodes,
                                    const std::string& self, int degree);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PUBLISH_FANOUT_H_
