#include "daemon/peer/parity_plan.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ckpt::daemon {
namespace {

struct Node {
  std::string id;
  std::string domain;
  int order = 0;  // position in the domain-interleaved order
  std::deque<const proto::ShardHolder*> shards;  // not yet in a group, by rank
  uint64_t parity_bytes = 0;
};

// Nodes sorted so that consecutive ones lie in different failure domains
// where possible: the first node of each domain, then the second of each...
std::vector<Node> InterleaveByDomain(
    std::map<std::string, std::string> domain_of) {
  std::map<std::string, std::vector<std::string>> by_domain;
  for (const auto& [id, domain] : domain_of) by_domain[domain].push_back(id);
  std::vector<Node> nodes;
  for (size_t round = 0; nodes.size() < domain_of.size(); ++round) {
    for (const auto& [domain, ids] : by_domain) {
      if (round < ids.size()) {
        Node n;
        n.id = ids[round];
        n.domain = domain;
        n.order = static_cast<int>(nodes.size());
        nodes.push_back(std::move(n));
      }
    }
  }
  return nodes;
}

// Picks up to `want` of `candidates` (already in preference order), taking
// nodes of domains not in `used` first.
std::vector<Node*> PickSpread(const std::vector<Node*>& candidates, size_t want,
                              std::set<std::string> used) {
  std::vector<Node*> picked;
  for (Node* n : candidates) {
    if (picked.size() == want) break;
    if (used.insert(n->domain).second) picked.push_back(n);
  }
  for (Node* n : candidates) {
    if (picked.size() == want) break;
    if (std::find(picked.begin(), picked.end(), n) == picked.end()) {
      picked.push_back(n);
    }
  }
  return picked;
}

}  // namespace

absl::StatusOr<proto::ParityPlan> PlanParity(
    const std::string& job, uint64_t step, int k, int m, uint32_t world_size,
    const std::vector<proto::ShardHolder>& holders,
    const std::vector<proto::PeerInfo>& nodes) {
  std::vector<const proto::ShardHolder*> by_rank(world_size, nullptr);
  for (const proto::ShardHolder& h : holders) {
    if (h.rank() >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("parity plan of job ", job, " step ", step, ": rank ",
                       h.rank(), " is outside world size ", world_size));
    }
    if (by_rank[h.rank()] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("parity plan of job ", job, " step ", step, ": rank ",
                       h.rank(), " has two holders (",
                       by_rank[h.rank()]->node(), " and ", h.node(), ")"));
    }
    by_rank[h.rank()] = &h;
  }
  std::map<std::string, std::string> domain_of;
  for (const proto::PeerInfo& p : nodes)
    domain_of[p.node_id()] = p.failure_domain();
  for (uint32_t r = 0; r < world_size; ++r) {
    if (by_rank[r] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("parity plan of job ", job,
                                                     " step ", step, ": rank ",
                                                     r, " has no holder"));
    }
    domain_of.emplace(by_rank[r]->node(), by_rank[r]->failure_domain());
  }
  const int n = static_cast<int>(domain_of.size());
  const int group_size = std::min(k, n - m);
  if (group_size < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("rs:", k, "+", m, " needs at least ", m + 1,
                     " live nodes (one data block and ", m,
                     " parity blocks per group); ", n, " are live"));
  }
  std::vector<Node> all = InterleaveByDomain(std::move(domain_of));
  std::map<std::string, Node*> node_of;
  for (Node& node : all) node_of[node.id] = &node;
  for (const proto::ShardHolder* h : by_rank) {
    node_of[h->node()]->shards.push_back(h);
  }

  proto::ParityPlan plan;
  plan.set_job(job);
  plan.set_step(step);
  plan.set_k(k);
  plan.set_m(m);
  plan.set_world_size(world_size);
  plan.set_planned_unix_micros(absl::ToUnixMicros(absl::Now()));
  for (;;) {
    // Nodes with the most shards left first, so that the last groups are
    // not all one node's.
    std::vector<Node*> loaded;
    for (Node& node : all) {
      if (!node.shards.empty()) loaded.push_back(&node);
    }
    if (loaded.empty()) break;
    std::stable_sort(loaded.begin(), loaded.end(), [](Node* a, Node* b) {
      return a->shards.size() > b->shards.size();
    });
    proto::ParityGroup* group = plan.add_groups();
    group->set_group(plan.groups_size() - 1);
    std::set<std::string> data_nodes, data_domains;
    for (Node* node : PickSpread(loaded, group_size, {})) {
      *group->add_data() = *node->shards.front();
      node->shards.pop_front();
      data_nodes.insert(node->id);
      data_domains.insert(node->domain);
      group->set_stripe_bytes(std::max(group->stripe_bytes(),
                                       group->data().rbegin()->file_bytes()));
    }
    std::vector<Node*> others;
    for (Node& node : all) {
      if (!data_nodes.count(node.id)) others.push_back(&node);
    }
    std::stable_sort(others.begin(), others.end(), [](Node* a, Node* b) {
      return a->parity_bytes < b->parity_bytes;
    });
    for (Node* node : PickSpread(others, m, data_domains)) {
      group->add_parity_nodes(node->id);
      node->parity_bytes += group->stripe_bytes();
    }
  }
  return plan;
}

absl::StatusOr<ParityPosition> FindInPlan(const proto::ParityPlan& plan,
                                          uint32_t rank) {
  for (const proto::ParityGroup& g : plan.groups()) {
    for (int i = 0; i < g.data_size(); ++i) {
      if (g.data(i).rank() == rank) return ParityPosition{&g, i};
    }
  }
  return absl::NotFoundError(absl::StrCat("the parity plan of job ", plan.job(),
                                          " step ", plan.step(),
                                          " has no rank ", rank));
}

std::vector<std::string> ParityHolders(const proto::ParityGroup& group,
                                       const std::set<std::string>& live) {
  std::set<std::string> in_group;
  for (const proto::ShardHolder& d : group.data()) in_group.insert(d.node());
  for (const std::string& p : group.parity_nodes()) in_group.insert(p);
  std::vector<std::string> spare;
  for (const std::string& node : live) {
    if (!in_group.count(node)) spare.push_back(node);
  }
  std::vector<std::string> holders;
  size_t next = 0;
  for (const std::string& p : group.parity_nodes()) {
    if (live.count(p)) {
      holders.push_back(p);
    } else {
      holders.push_back(next < spare.size() ? spare[next++] : std::string());
    }
  }
  return holders;
}

std::vector<std::string> DataStandIns(const proto::ParityGroup& group,
                                      const std::set<std::string>& live) {
  const std::vector<std::string> holders = ParityHolders(group, live);
  std::set<std::string> data_nodes, taken(holders.begin(), holders.end());
  for (const proto::ShardHolder& d : group.data()) data_nodes.insert(d.node());
  for (const std::string& p : group.parity_nodes()) taken.insert(p);
  taken.insert(data_nodes.begin(), data_nodes.end());
  // Nodes with no block of the group first, then the parity holders.
  std::vector<std::string> spare, second;
  for (const std::string& node : live) {
    if (!taken.count(node)) {
      spare.push_back(node);
    } else if (!data_nodes.count(node)) {
      second.push_back(node);
    }
  }
  spare.insert(spare.end(), second.begin(), second.end());
  std::vector<std::string> stand_ins;
  size_t next = 0;
  for (const proto::ShardHolder& d : group.data()) {
    if (live.count(d.node()) || spare.empty()) {
      stand_ins.emplace_back();
    } else {
      stand_ins.push_back(spare[next++ % spare.size()]);
    }
  }
  return stand_ins;
}

uint64_t ParityBytes(const proto::ParityPlan& plan) {
  uint64_t total = 0;
  for (const proto::ParityGroup& g : plan.groups()) {
    total += g.stripe_bytes() * g.parity_nodes_size();
  }
  return total;
}

proto::ParityBlockKey BlockKey(const std::string& job, uint64_t step,
                               const proto::ParityGroup& group,
                               uint32_t index) {
  proto::ParityBlockKey key;
  key.set_job(job);
  key.set_step(step);
  key.set_group(group.group());
  key.set_index(index);
  return key;
}

}  // namespace ckpt::daemon
