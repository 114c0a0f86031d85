#include "daemon/peer/peer_directory.h"

#include "io/logging.h"

namespace ckpt::daemon {

void PeerDirectory::Learn(const std::vector<proto::PeerInfo>& peers,
                          absl::Time asked) {
  absl::MutexLock lock(&mu_);
  if (asked < asked_) return;  // an older listing than the one held
  asked_ = asked;
  node_at_.clear();
  address_of_.clear();
  for (const proto::PeerInfo& p : peers) {
    node_at_[p.address()] = p.node_id();
    address_of_[p.node_id()] = p.address();
  }
}

bool PeerDirectory::IsMember(const std::string& node) {
  if (node.empty()) return false;
  if (node == self_) return true;
  return Find([this, &node]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return address_of_.count(node) > 0;
  });
}

std::string PeerDirectory::NodeAt(const std::string& address) {
  std::string node;
  Find([this, &address, &node]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = node_at_.find(address);
    if (it == node_at_.end()) return false;
    node = it->second;
    return true;
  });
  return node;
}

bool PeerDirectory::Find(const std::function<bool()>& found) {
  const absl::Time missed = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    if (found()) return true;
  }
  Refresh(missed);
  absl::MutexLock lock(&mu_);
  return found();
}

void PeerDirectory::Refresh(absl::Time missed) {
  absl::MutexLock serial(&refresh_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (asked_ > missed) return;
  }
  const absl::Time asking = absl::Now();
  absl::StatusOr<std::vector<proto::PeerInfo>> peers =
      coordinator_->ListPeers();
  if (!peers.ok()) {
    CKPT_LOG_WARN("peer directory: listing the cluster's nodes: {}",
                  peers.status().ToString());
    return;
  }
  Learn(*peers, asking);
}

}  // namespace ckpt::daemon
