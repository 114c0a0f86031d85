// Subscriptions: the topics this node subscribes to (ckptd --subscribe, the
// config's `subscribe`, or `ckpt subscribe`), each followed by a thread that
// fetches every new version from the node's peers as it is published
// (issue #37).
//
// A subscriber records itself in the coordinator (SubscriberRecord, with the
// versions it holds), watches the topic's versions, and receives the newest
// one it lacks: file by file, each from the nodes FetchOrder names (its
// parent in the fan-out tree first), into an Arrival that the peers below it
// read while it arrives. A peer that fails, sends nothing for `stall`, or
// sent bytes that do not verify is passed over for the next one, the fetch
// resuming where it stopped (bytes found bad: from the start of the file).
// Each file is verified whole (every chunk's checksum, the manifest's seal
// and its XXH3 against the version's record) before the version is placed;
// until then local readers do not see it. A node that starts or restarts
// late fetches the newest version the same way, from whichever node holds
// it.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_PUBLISH_SUBSCRIPTIONS_H_
#define CKPT_DAEMON_PUBLISH_SUBSCRIPTIONS_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/common/metrics.h"
#include "daemon/coord/coordinator.h"
#include "daemon/publish/arrival.h"
#include "daemon/publish/publisher.h"
#include "io/file_system.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace ckpt::daemon {

struct SubscriptionOptions {
  std::string node_id;
  // The fan-out tree's degree; 0: AutoDegree.
  int degree = 0;
  // A peer that sends nothing this long is passed over.
  absl::Duration stall = absl::Seconds(5);
  // How long a wait for a topic's next version lasts (the coordinator
  // watches; a stop waits for it at most this long), and the pause after a
  // round that failed.
  absl::Duration watch = absl::Milliseconds(500);
  absl::Duration poll = absl::Milliseconds(50);
};

class Subscriptions {
 public:
  using ChannelTo =
      std::function<std::shared_ptr<grpc::Channel>(const std::string&)>;
  // `fs`: where the received files are read back to verify them.
  Subscriptions(io::FileSystem* fs, Publisher* publisher,
                Coordinator* coordinator, Metrics* metrics,
                ChannelTo channel_to, SubscriptionOptions options);
  // Stops following every topic (an arrival in flight is abandoned).
  ~Subscriptions();

  // Follows `topic` from now on; false when it was followed already.
  absl::StatusOr<bool> Add(const std::string& topic);
  bool Follows(const std::string& topic) const;

 private:
  class Receiving;  // one version being received (subscriptions.cc)

  // The topic's thread: a round whenever the coordinator has a newer
  // version (and every `watch` at least) until stopped.
  void Follow(const std::string& topic);
  // One round: the newest version, received unless held; the subscriber
  // record whenever the versions held changed (`recorded`: as last put).
  // Returns the newest version, now held.
  absl::StatusOr<uint64_t> CatchUp(const std::string& topic,
                                   std::set<uint64_t>& recorded);
  absl::Status Receive(const proto::VersionRecord& version);
  // Who to fetch `version` from, in order, with their peer addresses.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> SourcesOf(
      const proto::VersionRecord& version);

  io::FileSystem* const fs_;
  Publisher* const publisher_;
  Coordinator* const coordinator_;
  Metrics* const metrics_;
  const ChannelTo channel_to_;
  const SubscriptionOptions options_;
  absl::Notification stopping_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PUBLISH_SUBSCRIPTIONS_H_
