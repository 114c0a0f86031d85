// EtcdCoordinator: membership. Each node's key /ckpt/nodes/<node> lives on
// its lease and holds its NodeRecord (the jobs it serves); the nodes watch
// the keys come and go.
#include "absl/strings/str_cat.h"
#include "daemon/coord/etcd_coordinator.h"
#include "daemon/coord/etcd_ops.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {

using etcd_ops::PrefixEnd;
using etcd_ops::PutOp;

namespace {

constexpr char kNodesPrefix[] = "/ckpt/nodes/";

// The jobs a membership key's value names (none for a damaged one, or one
// an older ckptd wrote: its node id alone). A name that is no job id is
// dropped: it would become a metric label and a catalog key here.
std::vector<std::string> JobsOf(const std::string& key,
                                const std::string& value) {
  proto::NodeRecord record;
  if (!record.ParseFromString(value)) return {};
  std::vector<std::string> jobs;
  for (const std::string& job : record.jobs()) {
    if (absl::Status s = snapshot::ValidateJobId(job); !s.ok()) {
      CKPT_LOG_WARN("{} names a job that is none: {}", key, s.ToString());
      continue;
    }
    jobs.push_back(job);
  }
  return jobs;
}

}  // namespace

std::string EtcdCoordinator::MemberKey() const {
  return absl::StrCat(kNodesPrefix, options_.node_id);
}

std::string EtcdCoordinator::MemberValue() const {
  proto::NodeRecord record;
  record.set_node_id(options_.node_id);
  absl::MutexLock lock(&mu_);
  for (const std::string& job : served_jobs_) record.add_jobs(job);
  return record.SerializeAsString();
}

absl::StatusOr<std::vector<std::string>> EtcdCoordinator::LiveNodes() {
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(kNodesPrefix, true));
  std::vector<std::string> nodes;
  for (const etcdserverpb::KeyValue& kv : r.kvs()) {
    nodes.push_back(kv.key().substr(sizeof(kNodesPrefix) - 1));
  }
  return nodes;
}

absl::StatusOr<Coordinator::Membership> EtcdCoordinator::WatchMembers(
    int64_t after_revision, absl::Duration timeout) {
  // Any event (a node joining or leaving) ends the wait.
  if (after_revision > 0) {
    WaitForChange(kNodesPrefix, true, after_revision, timeout);
  }
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse r, Range(kNodesPrefix, true));
  Membership m;
  m.revision = r.header().revision();
  for (const etcdserverpb::KeyValue& kv : r.kvs()) {
    m.nodes.push_back(kv.key().substr(sizeof(kNodesPrefix) - 1));
  }
  return m;
}

absl::Status EtcdCoordinator::SetServedJobs(
    const std::vector<std::string>& jobs) {
  for (const std::string& job : jobs)
    RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    served_jobs_ = jobs;
    lease = lease_;
  }
  // Without a lease, Register writes them when it takes the next one.
  if (lease == 0) return absl::OkStatus();
  etcdserverpb::TxnRequest txn;
  *txn.add_compare() = HoldsLease(lease);
  *txn.add_success() = PutOp(MemberKey(), MemberValue());
  txn.mutable_success(0)->mutable_request_put()->set_lease(lease);
  ASSIGN_OR_RETURN(
      etcdserverpb::TxnResponse done,
      Txn(txn, "recording the jobs node " + options_.node_id + " serves"));
  if (done.succeeded()) return absl::OkStatus();
  return FencedOr(lease, absl::AbortedError("recording the jobs raced"));
}

absl::StatusOr<std::vector<Coordinator::MemberChange>>
EtcdCoordinator::WatchMemberChanges(int64_t* revision, absl::Duration timeout) {
  if (*revision == 0) {
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse now,
                     Range(kNodesPrefix, true));
    *revision = now.header().revision();
  }
  // (prev_kv: a deleted key's value names the jobs it served.)
  const etcdserverpb::WatchResponse resp =
      WaitForChange(kNodesPrefix, true, *revision, timeout, /*prev_kv=*/true);
  if (resp.compact_revision() > 0) {
    // The changes since were compacted away: go on from what is left.
    CKPT_LOG_WARN(
        "membership changes after revision {} were compacted (at {}); some "
        "departures may go uncounted",
        *revision, resp.compact_revision());
    *revision = resp.compact_revision() - 1;
    return std::vector<MemberChange>{};
  }
  std::vector<MemberChange> changes;
  for (const etcdserverpb::Event& e : resp.events()) {
    *revision = std::max(*revision, e.kv().mod_revision());
    MemberChange c;
    c.node = e.kv().key().substr(sizeof(kNodesPrefix) - 1);
    if (e.type() == etcdserverpb::Event::DELETE) {
      c.lease = e.prev_kv().lease();
      c.jobs = JobsOf(e.kv().key(), e.prev_kv().value());
    } else if (!e.has_prev_kv() || e.prev_kv().lease() != e.kv().lease()) {
      c.joined = true;
      c.lease = e.kv().lease();
      c.jobs = JobsOf(e.kv().key(), e.kv().value());
    } else {
      continue;  // the same membership, its jobs updated
    }
    changes.push_back(std::move(c));
  }
  return changes;
}

}  // namespace ckpt::daemon
