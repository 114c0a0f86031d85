// EtcdCoordinator: the many-node coordination backend, on etcd v3 over gRPC
// (the key layout of coordinator.h). Each ckptd holds a lease, kept alive by a
// background stream, and a membership key /ckpt/nodes/<node> attached to it.
// Votes, commit records, latest-step updates and garbage collection are
// transactions that also compare the membership key's lease with this node's:
// a daemon paused past its lease (SIGSTOP, a long GC pause) finds its key gone
// and can neither vote, commit nor forget anything (it is fenced) until the
// keep-alive loop has taken a new lease and registered again. A commit record
// is created only if absent and a latest pointer only moves forward, in the
// same transaction, so a commit never reverts or duplicates and the latest
// committed step never goes backward, whichever nodes race.
//
// Thread-safety: thread-safe.
#ifndef CKPT_DAEMON_COORD_ETCD_COORDINATOR_H_
#define CKPT_DAEMON_COORD_ETCD_COORDINATOR_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/coord/coordinator.h"
#include "proto/etcd.grpc.pb.h"

namespace ckpt::daemon {

struct EtcdOptions {
  // host:port of etcd's client URLs (one or more members of one cluster).
  std::vector<std::string> endpoints;
  std::string node_id;
  absl::Duration lease_ttl = absl::Seconds(10);
  absl::Duration rpc_timeout = absl::Seconds(5);
  // TLS to etcd, as etcd's own clients take it: the CA that signed etcd's
  // server certificate (empty: plaintext) and, for etcd's
  // --client-cert-auth, this node's certificate and key (with auth on, etcd
  // takes the certificate's common name as the user).
  std::string ca_file, cert_file, key_file;
  // etcd's auth by user and password, the password read from
  // `password_file` (its first line): every call carries a token from
  // Authenticate, renewed every `token_refresh`.
  std::string user, password_file;
  absl::Duration token_refresh = absl::Seconds(60);
};

// Parses "etcd://host:port[,host:port...]" into endpoints.
absl::StatusOr<std::vector<std::string>> ParseEtcdUrl(absl::string_view url);

class EtcdCoordinator final : public Coordinator {
 public:
  // Connects, takes a lease and registers this node (its earlier
  // departures' claims go).
  static absl::StatusOr<std::unique_ptr<EtcdCoordinator>> Connect(
      const EtcdOptions& options);
  // Stops the keep-alives and revokes the lease (peers see the node leave,
  // its departure claimed by itself: it was not lost).
  ~EtcdCoordinator() override;

  // Votes cast while another of the same step, world size and tiers is in
  // flight go together in the next transaction (a node's ranks finishing at
  // once make one vote of the node).
  absl::StatusOr<std::vector<proto::Tier>> Vote(
      const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
      const std::vector<proto::Tier>& tiers) override;
  // One transaction per kVoteBatch ranks, which counts the step's votes
  // per tier without reading them (count-only ranges over the index keys):
  // a vote's cost does not grow with the number of ranks.
  absl::StatusOr<std::vector<proto::Tier>> VoteMany(
      const std::string& job, uint64_t step, const std::vector<uint32_t>& ranks,
      uint32_t world_size, const std::vector<proto::Tier>& tiers) override;
  // Ranks per vote transaction (etcd's --max-txn-ops is 128 by default).
  static constexpr size_t kVoteBatch = 16;
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
  // Watches /ckpt/nodes/: a node that stops renewing its lease leaves when
  // etcd expires it (within the TTL), and a joining node appears.
  absl::StatusOr<Membership> WatchMembers(int64_t after_revision,
                                          absl::Duration timeout) override;
  // Watches /ckpt/nodes/ from `*revision` + 1, with the values deleted
  // keys had (a lapsed lease's record names the jobs the node served).
  absl::StatusOr<std::vector<MemberChange>> WatchMemberChanges(
      int64_t* revision, absl::Duration timeout) override;
  // Rewrites this node's membership record (and Register writes them with
  // each new lease).
  absl::Status SetServedJobs(const std::vector<std::string>& jobs) override;

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
  // The nodes holding a lease now (their membership keys), sorted.
  absl::StatusOr<std::vector<std::string>> LiveNodes();

  // The lease this node holds now (0 while it has none).
  int64_t lease_id() const;
  // Times this node took a lease after losing one (fenced, then rejoined).
  int rejoins() const { return rejoins_.load(); }
  int Rejoins() const override { return rejoins_.load(); }
  // Watches for version after + 1's key.
  absl::Status WaitForVersionAfter(const std::string& topic, uint64_t after,
                                   absl::Duration timeout) override;
  std::string MemberKey() const;
  // Tests: stop (and resume) renewing the lease, as a paused process would.
  void PauseKeepAliveForTesting(bool paused);

 private:
  explicit EtcdCoordinator(const EtcdOptions& options);
  // Takes a fresh lease and puts the membership key on it.
  absl::Status Register();
  // The membership key's value: a NodeRecord naming served_jobs_.
  std::string MemberValue() const ABSL_LOCKS_EXCLUDED(mu_);
  void KeepAliveLoop();
  // Takes a token for options_.user (no-op without a user).
  absl::Status Authenticate();
  // Renews the token once it is older than options_.token_refresh.
  void RefreshToken();
  // A call's outcome as an absl::Status naming `what`. etcd forgets its
  // tokens when it restarts ("invalid auth token"): a new one is taken at
  // once, for the caller's next try.
  absl::Status Checked(const grpc::Status& s, absl::string_view what);
  // Adds the auth token (if any) to a call's metadata.
  void Authorize(grpc::ClientContext* context) const;
  // Authorize, and the deadline of options_.rpc_timeout.
  grpc::ClientContext* Prepare(grpc::ClientContext* context) const;
  // The comparison that fences a node without its lease.
  etcdserverpb::Compare HoldsLease(int64_t lease) const;
  // Explains a transaction that failed its comparisons: fenced, or `other`.
  absl::Status FencedOr(int64_t lease, absl::Status other);
  absl::StatusOr<etcdserverpb::RangeResponse> Range(const std::string& key,
                                                    bool prefix);
  // Waits until `key` (or with `prefix`, a key under it) changes after
  // `after_revision`, or `timeout` passes; returns the watch's response
  // with the first events (with `prev_kv`, the values changed keys had), or
  // the one that canceled it, or an empty one.
  etcdserverpb::WatchResponse WaitForChange(const std::string& key, bool prefix,
                                            int64_t after_revision,
                                            absl::Duration timeout,
                                            bool prev_kv = false);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(
      const etcdserverpb::TxnRequest& request, const std::string& what);
  // VoteMany's steps (etcd_coordinator_steps.cc): the votes of up to
  // kVoteBatch ranks written, with what the step has after them counted
  // (StepCounts); the world sizes voted with checked (one, or the error that
  // names the rank that differs); a tier's commit made.
  struct StepCounts {
    std::map<proto::Tier, int64_t> reached;  // ranks that reached each tier
    int64_t worlds = 0;                      // world sizes voted with
    std::set<std::string> commits;           // commit keys of the step
  };
  absl::StatusOr<StepCounts> WriteVotes(const std::string& job, uint64_t step,
                                        const std::vector<uint32_t>& ranks,
                                        uint32_t world_size,
                                        const std::vector<proto::Tier>& tiers,
                                        int64_t lease, const std::string& what);
  absl::Status CheckOneWorld(const std::string& job, uint64_t step,
                             uint32_t world_size, const std::string& what);
  absl::Status CommitTier(const std::string& job, uint64_t step,
                          proto::Tier tier, uint32_t world_size, int64_t lease,
                          const std::string& what);

  const EtcdOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_stub_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_stub_;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth_stub_;
  // Held while Checked renews a token etcd forgot (taken before mu_).
  absl::Mutex renew_mu_;
  mutable absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  absl::Time token_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> served_jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  // Votes waiting for the transaction in flight of their kind (Vote).
  struct Queued {
    uint32_t rank = 0;
    bool done = false;
    absl::StatusOr<std::vector<proto::Tier>> result;
  };
  struct VoteKind {
    std::string job;
    uint64_t step = 0;
    uint32_t world_size = 0;
    std::vector<proto::Tier> tiers;  // sorted
    bool operator<(const VoteKind& o) const {
      return std::tie(job, step, world_size, tiers) <
             std::tie(o.job, o.step, o.world_size, o.tiers);
    }
  };
  struct VoteQueue {
    std::vector<Queued*> waiting;
    bool flushing = false;
  };
  absl::Mutex votes_mu_;  // taken before mu_
  absl::CondVar voted_;
  std::map<VoteKind, VoteQueue> vote_queues_ ABSL_GUARDED_BY(votes_mu_);
  // The votes this node wrote: key -> (record, revision written at).
  std::map<std::string, std::pair<std::string, int64_t>> my_votes_
      ABSL_GUARDED_BY(mu_);
  std::atomic<int> rejoins_{0};
  std::thread keep_alive_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_COORD_ETCD_COORDINATOR_H_
