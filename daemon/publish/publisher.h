// Publisher is ckptd's side of publication (issue #37): a committed step, or
// the items of it that globs choose, becomes version V of a topic that
// rollout and inference engines read.
//
// Publishing reads each rank's persisted shard of the step on this node
// (every chunk verified) — a rank whose shard lies on another node (a job on
// several nodes) is fetched first, all such ranks at once, from the peers
// that hold a copy, and kept as a fetched copy like a restore's — keeps the
// chosen items, casts float32 items to bfloat16 when asked (rounded to nearest
// even, NaN quiet: bit-identical to torch's `.to(torch.bfloat16)`), and writes
// one self-contained, sealed file per rank, stored raw so readers copy straight
// out of it, into the version store (version_store.h). Only then is the version
// numbered, through the coordinator (Coordinator::AddVersion: versions increase
// monotonically, and a version's record never changes), and placed: a reader
// never finds a version whose files are not all there.
//
// A subscriber node receives versions made elsewhere into the same store
// (BeginArrival: an Arrival, served to the peers downstream while it
// arrives; PlaceArrival once every file is whole and verified). Local
// readers see only placed versions.
//
// The store keeps the newest `keep_versions` versions of each topic and any
// version a reader holds, within `budget_bytes`: a version that does not fit
// (made here or arriving) is refused with ResourceExhausted.
//
// Thread-safety: thread-safe. Publishes run one at a time.
#ifndef CKPT_DAEMON_PUBLISH_PUBLISHER_H_
#define CKPT_DAEMON_PUBLISH_PUBLISHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "daemon/common/metrics.h"
#include "daemon/coord/coordinator.h"
#include "daemon/publish/arrival.h"
#include "daemon/publish/version_store.h"
#include "io/file_system.h"
#include "proto/publish.pb.h"

namespace ckpt::daemon {

struct PublishOptions {
  std::string node_id;
  // tmpfs (memory): the versions this node holds.
  std::string dir;
  int keep_versions = 2;  // per topic
  // Every version held, made or arriving, together (--publish-budget).
  uint64_t budget_bytes = 4ull << 30;
};

class Publisher {
 public:
  // The path of this node's persisted shard of a rank, if it has one.
  using LocalShardFile =
      std::function<absl::StatusOr<absl::optional<std::string>>(
          const std::string& job, uint64_t step, uint32_t rank)>;
  // The path of a copy of a rank's shard fetched here from a peer (the
  // replicator's Fetch); null: this node has no peers.
  using FetchShardFile = std::function<absl::StatusOr<std::string>(
      const std::string& job, uint64_t step, uint32_t rank)>;

  // Removes what a publish cut short left in `options.dir` (made, mode 0700,
  // at the first publish).
  static absl::StatusOr<std::unique_ptr<Publisher>> Open(
      io::FileSystem* fs, PublishOptions options, Coordinator* coordinator,
      Metrics* metrics, LocalShardFile local_file,
      FetchShardFile fetch_file = nullptr);

  // Makes the next version of `request.topic` from step `request.step` of
  // `request.job`, committed on disk; the ranks whose shards are not on this
  // node are fetched from its peers first.
  // InvalidArgument names a bad topic, cast or glob (one that matches no
  // item); FailedPrecondition a step not committed on disk or a rank whose
  // shard is neither here nor to be fetched (the peer's error named).
  absl::StatusOr<proto::VersionRecord> Publish(
      const proto::PublishRequest& request);

  // The newest version of `topic` above `after` held here, once there is
  // one; DeadlineExceeded at `deadline`, saying why.
  absl::StatusOr<proto::VersionRecord> WaitForVersion(const std::string& topic,
                                                      uint64_t after,
                                                      absl::Time deadline);

  // Where version `version` (0: the newest held here) of `topic` lies here:
  // its record (kept beside the files) and a file per rank. NotFound when
  // this node does not hold it (any more).
  absl::StatusOr<proto::OpenVersionResponse> OpenVersion(
      const std::string& topic, uint64_t version);

  // Every topic: its newest version and the versions held here.
  absl::StatusOr<proto::ListTopicsResponse> ListTopics();

  // The versions of `topic` whose files this node holds.
  std::set<uint64_t> Held(const std::string& topic) const;

  // A version made on another node begins to arrive here (the files created,
  // empty); AlreadyExists when it is arriving already, ResourceExhausted when
  // it does not fit the budget, DataLoss when its record does not add up.
  absl::StatusOr<std::shared_ptr<Arrival>> BeginArrival(
      const proto::VersionRecord& record);
  // Every file of `arrival` is whole and verified: the version is placed
  // (readable here), the older ones beyond keep_versions dropped.
  absl::Status PlaceArrival(Arrival& arrival);
  // The arrival is given up: its files go, its readers fail with `why`.
  void AbandonArrival(Arrival& arrival, const absl::Status& why);

  // What a peer asked for: bytes of a rank's file of a version from an
  // offset on, at `path`. A file still arriving here also comes as
  // `arriving` (its reads wait for the bytes) and `wait` (for a sender that
  // reads `path` itself).
  struct PeerRead {
    std::string path;
    uint64_t offset = 0;
    uint64_t bytes = 0;  // from the offset to the end
    std::unique_ptr<io::ReadableFile> arriving;
    std::function<absl::Status(uint64_t end)> wait;
  };
  // A version newer than every one held here may be about to arrive: asked
  // for it, this waits up to `wait` for it to begin. NotFound when it does
  // not; `stall`: how long a read of an arriving file waits for a piece.
  // How much of the file of `request` this node has (placed: all of it).
  // NotFound when it neither holds nor receives the version.
  absl::StatusOr<proto::VersionFileProgress> ProgressOf(
      const proto::VersionFileRequest& request);
  absl::StatusOr<PeerRead> OpenForPeer(const proto::VersionFileRequest& request,
                                       absl::Duration wait,
                                       absl::Duration stall);

 private:
  Publisher(io::FileSystem* fs, PublishOptions options,
            std::unique_ptr<VersionStore> store, Coordinator* coordinator,
            Metrics* metrics, LocalShardFile local_file,
            FetchShardFile fetch_file);

  // Publish's steps: every rank's persisted shard of the step on this node
  // (the step committed on disk); and, once a version is numbered and in
  // place, its figures, the older versions dropped, waiters woken.
  absl::StatusOr<std::vector<std::string>> SourcesOf(
      const proto::PublishRequest& request, const std::string& what);
  // SourcesOf's fetch of the ranks `missing` (their paths into `sources`),
  // all at once.
  absl::Status FetchMissing(const proto::PublishRequest& request,
                            const std::vector<uint32_t>& missing,
                            const std::string& what,
                            std::vector<std::string>& sources);
  void Published(const proto::VersionRecord& version, size_t items,
                 absl::Time start, const std::string& what);

  // The record of `version` (0: the newest held here) of `topic`: from
  // beside its files when held here, else from the coordinator.
  absl::StatusOr<proto::VersionRecord> HeldRecord(const std::string& topic,
                                                  uint64_t version);
  // WaitForVersion's error: what the coordinator knows of the topic.
  absl::Status NoVersionAbove(const std::string& topic, uint64_t after,
                              const std::set<uint64_t>& held);
  // A placed version's file of `request`, if this node holds it.
  absl::StatusOr<absl::optional<PeerRead>> PlacedForPeer(
      const proto::VersionFileRequest& request);
  // `read` as served: counted in the figures.
  PeerRead Served(const proto::VersionFileRequest& request, PeerRead read);
  // The figure of the bytes held.
  void HeldBytesChanged();

  io::FileSystem* const fs_;
  const PublishOptions options_;
  const std::unique_ptr<VersionStore> store_;
  Coordinator* const coordinator_;
  Metrics* const metrics_;
  const LocalShardFile local_file_;
  const FetchShardFile fetch_file_;

  absl::Mutex publish_mu_;  // one publish at a time
  mutable absl::Mutex mu_;
  absl::CondVar published_;  // a version was made or placed here
  uint64_t made_ ABSL_GUARDED_BY(mu_) = 0;
  // Versions arriving, by topic and version, and the room they take.
  struct Arriving {
    std::shared_ptr<Arrival> arrival;
    std::unique_ptr<VersionStore::Room> room;
  };
  std::map<std::pair<std::string, uint64_t>, Arriving> arriving_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PUBLISH_PUBLISHER_H_
