// PeerDirectory: who is in the cluster, as the coordinator last listed the
// peers (node id and the address each published). The peer service asks it
// whether a certificate's name is a node of the cluster; the replicator asks
// it which node published an address, to check that the node answering there
// is that node. A name or address not in the last listing makes it ask the
// coordinator again, one listing at a time: a miss is answered by any listing
// begun after it, so a flood of calls from unknown names costs the
// coordinator one read at a time. Each listing replaces the last one whole:
// a node that left is no longer a member.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_PEER_PEER_DIRECTORY_H_
#define CKPT_DAEMON_PEER_PEER_DIRECTORY_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/coord/coordinator.h"
#include "proto/peer.pb.h"

namespace ckpt::daemon {

class PeerDirectory {
 public:
  // `self`: this node's id, always a member.
  PeerDirectory(Coordinator* coordinator, std::string self)
      : coordinator_(coordinator), self_(std::move(self)) {}

  // Takes a listing of the peers that began at `asked` (one the caller made
  // anyway), unless a newer one is held.
  void Learn(const std::vector<proto::PeerInfo>& peers, absl::Time asked);
  // Whether `node` is this node or published a peer address.
  bool IsMember(const std::string& node);
  // The node that published `address`; empty when none did.
  std::string NodeAt(const std::string& address);

 private:
  // Looks `found` up in the last listing, then in a fresh one.
  bool Find(const std::function<bool()>& found);
  // Lists the peers again, unless a listing begun since `missed` did.
  void Refresh(absl::Time missed);

  Coordinator* const coordinator_;
  const std::string self_;
  absl::Mutex refresh_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> node_at_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> address_of_ ABSL_GUARDED_BY(mu_);
  absl::Time asked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_PEER_DIRECTORY_H_
