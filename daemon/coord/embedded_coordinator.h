// EmbeddedCoordinator: the single-node coordination backend, stored in ckptd's
// own RocksDB (KvStore). A vote, and the commit records and latest-step updates
// it triggers, are written in one synced batch, so a crash never leaves a
// commit without its votes or a latest pointer that names an uncommitted step.
//
// Thread-safety: thread-safe (one mutex serializes read-modify-write of votes).
#ifndef CKPT_DAEMON_COORD_EMBEDDED_COORDINATOR_H_
#define CKPT_DAEMON_COORD_EMBEDDED_COORDINATOR_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/catalog/kv_store.h"
#include "daemon/coord/coordinator.h"

namespace ckpt::daemon {

class EmbeddedCoordinator final : public Coordinator {
 public:
  // `store` must outlive this object.
  explicit EmbeddedCoordinator(KvStore* store, std::string node_id = "local")
      : store_(store), node_id_(std::move(node_id)) {}

  absl::StatusOr<std::vector<proto::Tier>> Vote(
      const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
      const std::vector<proto::Tier>& tiers) override;
  absl::StatusOr<absl::optional<proto::CommitRecord>> GetCommit(
      const std::string& job, uint64_t step, proto::Tier tier) override;
  absl::StatusOr<absl::optional<uint64_t>> LatestCommitted(
      const std::string& job, proto::Tier tier) override;
  absl::StatusOr<std::vector<proto::CommitRecord>> ListCommits(
      const std::string& job) override;
  absl::StatusOr<std::set<uint64_t>> StepsVotedAt(const std::string& job,
                                                  proto::Tier tier,
                                                  uint64_t after) override;
  absl::Status WithdrawVote(const std::string& job, uint64_t step,
                            uint32_t rank) override;
  absl::Status ForgetStep(const std::string& job, uint64_t step) override;
  absl::Status RollBack(const std::string& job, uint64_t step,
                        const proto::RollbackRecord& record) override;
  // One node, which is alive while it answers: the membership never changes.
  absl::StatusOr<Membership> WatchMembers(int64_t after_revision,
                                          absl::Duration timeout) override;

 protected:
  absl::StatusOr<absl::optional<std::string>> StoreGet(
      const std::string& key) override;
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> StoreScan(
      const std::string& prefix) override;
  absl::Status StorePut(const std::string& key, const std::string& value,
                        bool ephemeral) override;
  absl::StatusOr<bool> StoreCreate(const std::string& key,
                                   const std::string& value) override;
  absl::Status StoreDelete(const std::string& key) override;

 public:
 private:
  KvStore* const store_;
  const std::string node_id_;
  absl::Mutex mu_;  // serializes votes and GC
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_COORD_EMBEDDED_COORDINATOR_H_
