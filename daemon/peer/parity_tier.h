// ParityTier is ckptd's side of the erasure-coded peer tier (DESIGN.md §2, T1
// with `--peer-redundancy rs:K+M`), beside the Replicator's K full replicas.
//
// Protecting: for every shard this node persisted it publishes where the
// shard lies (Coordinator::PublishShardHolder). Once every rank of the step
// did, the first node to see it settles the step's parity plan (parity_plan.h)
// through the coordinator; then each data node streams its shard file's
// contribution to each of its group's m parity holders (PushParity), which
// verify it and XOR it in (ParityStore). A shard counts as protected, and the
// service votes TIER_PEER for it, once every parity block of its group is
// complete: its group then survives the loss of any m of its nodes. A shard
// short of that is tried again every `retry_interval`.
//
// Rebuilding: a restore of a shard no live node has decodes it from k blocks
// of its group (the other data nodes' shard files, the parity blocks), and
// the caller verifies every chunk as with any fetched copy.
//
// Thread-safety: thread-safe; one thread pushes.
#ifndef CKPT_DAEMON_PEER_PARITY_TIER_H_
#define CKPT_DAEMON_PEER_PARITY_TIER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "daemon/common/metrics.h"
#include "daemon/coord/coordinator.h"
#include "daemon/peer/parity_plan.h"
#include "daemon/peer/parity_store.h"
#include "io/file_system.h"
#include "io/rate_limiter.h"
#include "proto/catalog.pb.h"
#include "proto/peer.pb.h"
#include "snapshot/erasure_code.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace ckpt::daemon {

struct ParityOptions {
  std::string node_id;
  std::string failure_domain;
  // rs:k+m; k == 0: no erasure-coded peer tier.
  int k = 0;
  int m = 0;
  // On tmpfs (memory): the parity blocks this node holds.
  std::string dir;
  uint64_t budget_bytes = 1ull << 30;
  absl::Duration retry_interval = absl::Seconds(1);
  // The node's cap on sends to peers (the replicator's); null: none.
  io::RateLimiter* send_rate = nullptr;
};

class ParityTier {
 public:
  // Called (on the pushing thread) once every parity block of the shard's
  // group is complete.
  using OnProtected = std::function<void(const proto::ShardRecord& shard)>;
  // A channel to a peer's address (shared with the Replicator).
  using ChannelTo =
      std::function<std::shared_ptr<grpc::Channel>(const std::string&)>;
  // The path of this node's persisted shard file, if it has one.
  using LocalShardFile =
      std::function<absl::StatusOr<absl::optional<std::string>>(
          const std::string& job, uint64_t step, uint32_t rank)>;

  static absl::StatusOr<std::unique_ptr<ParityTier>> Start(
      io::FileSystem* fs, ParityOptions options, Coordinator* coordinator,
      Metrics* metrics, ChannelTo channel_to, LocalShardFile local_file,
      OnProtected on_protected);
  ~ParityTier();

  const snapshot::ErasureCode& code() const { return code_; }
  ParityStore* store() { return store_.get(); }

  // A persisted shard of this node (state PERSISTED, `shard_path` set) to
  // protect. `again`: it was protected, and nodes holding its group's parity
  // were lost: its parity is made again on the nodes that replace them
  // (ParityHolders), without a new vote.
  void Enqueue(const proto::ShardRecord& shard, bool again = false);
  // Shards not yet protected (for tests and `ckpt status`).
  size_t pending() const;

  // Where a rebuilt shard file of `bytes` bytes goes: a writer that takes it
  // segment by segment, at their offsets, from the decoding threads (a
  // fetched copy's receiver), or an error: that shard is then not rebuilt
  // (the one asked for: the rebuild fails with the error).
  using RebuildWriter = std::function<absl::Status(
      uint64_t offset, absl::Span<const uint8_t> bytes)>;
  using RebuildSink = std::function<absl::StatusOr<RebuildWriter>(
      uint32_t rank, uint64_t bytes)>;
  // Decodes a shard's file (self-contained) from k blocks of its group on
  // live nodes, fetched at once and decoded as they arrive, together with
  // the group's other shards whose nodes are gone too, through writers from
  // `sink`. Returns the ranks rebuilt, the one asked for first.
  // FailedPrecondition names the group and every block that could not be
  // had when fewer than k could; NotFound when the step has no parity plan.
  // The caller verifies every chunk.
  absl::StatusOr<std::vector<uint32_t>> Rebuild(const std::string& job,
                                                uint64_t step, uint32_t rank,
                                                const RebuildSink& sink);

  // Nodes were lost: the data shards of every step's groups whose nodes are
  // gone are rebuilt ahead of any restore, each by one live node
  // (DataStandIns) that keeps a copy in the lost node's place. Restores fetch
  // it, and later rebuilds read it as the lost data block: the group again
  // survives m losses. Done on a thread of its own, through `repair`.
  void RepairLostData();
  // Fetches a shard onto this node as a checked copy (the Replicator's
  // Fetch, which falls back to Rebuild).
  using Repair = std::function<absl::Status(const std::string& job,
                                            uint64_t step, uint32_t rank)>;
  void SetRepair(Repair repair);

  // Drops the parity blocks this node holds for steps of `job` that `keep`
  // says are no longer kept.
  void CollectGarbage(const std::string& job,
                      const std::function<bool(uint64_t step)>& keep);

 private:
  struct Pending {
    proto::ShardRecord shard;
    bool again = false;
    absl::Time since;  // enqueued
    bool published = false;
    proto::ShardHolder holder;
    int attempts = 0;
  };
  ParityTier(io::FileSystem* fs, ParityOptions options,
             snapshot::ErasureCode code, Coordinator* coordinator,
             Metrics* metrics, ChannelTo channel_to, LocalShardFile local_file,
             OnProtected on_protected);
  void Loop();
  // One round for `p`: true when it is protected (or hopeless).
  bool Protect(Pending& p);
  // How a step of Protect's round ends: the round goes on, or ends with the
  // shard looked at again later, or done with (protected, or hopeless).
  enum class Round { kGoOn, kAgain, kDone };
  // Publishes where this node's shard lies, once.
  Round PublishHolder(Pending& p);
  // The step's plan and the shard's place in it, once every rank's holder is
  // known; done when the plan is for another copy of the shard.
  Round PlaceInPlan(const Pending& p, absl::optional<proto::ParityPlan>* plan,
                    ParityPosition* at);
  // The state of the group's parity blocks on their holders, as far as data
  // block `position` is concerned. Unavailable names a holder that cannot be
  // asked.
  struct BlockSurvey {
    std::vector<uint32_t> missing;  // blocks without its contribution
    int complete = 0;               // blocks with every contribution
  };
  absl::StatusOr<BlockSurvey> SurveyBlocks(
      const proto::ShardRecord& shard, const proto::ParityGroup& group,
      uint32_t position, const std::vector<std::string>& holders,
      const std::map<std::string, proto::PeerInfo>& live);
  // Says so (and counts a protection made again, or votes for a new one).
  void Protected(const Pending& p, const proto::ParityGroup& group,
                 const std::vector<std::string>& holders);
  // Why `p` is not protected yet: said once, then every 50 rounds.
  void Note(const Pending& p, const std::string& why) const;
  // The step's plan: the one kept, else one made now if every rank's holder
  // is known; nullopt while some are not.
  absl::StatusOr<absl::optional<proto::ParityPlan>> PlanOf(
      const proto::ShardRecord& shard);
  // Streams `file`'s contribution (data block `position` of `group`) to the
  // parity blocks `indices` of the group, held by `holders`, at once.
  absl::Status PushContributions(
      const proto::ShardRecord& shard, const proto::ParityGroup& group,
      uint32_t position, const std::vector<uint32_t>& indices,
      const std::vector<std::string>& holders,
      const std::map<std::string, proto::PeerInfo>& live);
  // The block's state on its holder (nullopt: the holder has none).
  absl::StatusOr<absl::optional<proto::ParityBlockRecord>> BlockOn(
      const std::string& address, const proto::ParityBlockKey& key);
  // The live nodes' addresses, by node id.
  absl::StatusOr<std::map<std::string, proto::PeerInfo>> LivePeers();
  void RepairLoop();
  void RepairPlan(const proto::ParityPlan& plan,
                  const std::set<std::string>& live, const Repair& repair);
  // A live node with a copy of a data shard whose node is gone (a stand-in
  // that rebuilt it, or one a restore fetched it to), this one first.
  absl::optional<std::string> CopyHolder(
      const proto::ParityPlan& plan, const proto::ShardHolder& shard,
      const std::map<std::string, proto::PeerInfo>& live);
  // A block of the group as a rebuild reads it, and the fetching threads'
  // word of its progress (parity_tier_rebuild.cc).
  struct Source;
  struct Arrivals;
  // One Rebuild, as named steps (parity_tier_rebuild.cc).
  class Rebuilding;
  // "data block 1 (rank 3 on node b)", "parity block 0 (on node e)".
  std::string BlockName(const proto::ParityGroup& group, int b,
                        const std::string& node) const;
  // Makes room for block `b` from `node` (a parity block held here is mapped
  // and whole at once).
  absl::Status PrepareBlock(const proto::ParityPlan& plan,
                            const proto::ParityGroup& group, int b,
                            const std::string& node, Source* source);
  // Fills a block PrepareBlock did not map: read here, or fetched from the
  // peer at `address`.
  absl::Status FillBlock(const proto::ParityPlan& plan,
                         const proto::ParityGroup& group, int b,
                         const std::string& node, const std::string& address,
                         Source* source, Arrivals* arrivals);

  io::FileSystem* const fs_;
  const ParityOptions options_;
  const snapshot::ErasureCode code_;
  Coordinator* const coordinator_;
  Metrics* const metrics_;
  const ChannelTo channel_to_;
  const LocalShardFile local_file_;
  const OnProtected on_protected_;
  std::unique_ptr<ParityStore> store_;

  mutable absl::Mutex mu_;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool repair_wanted_ ABSL_GUARDED_BY(mu_) = false;
  Repair repair_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
  std::thread repairer_;  // RepairLoop
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_PARITY_TIER_H_
