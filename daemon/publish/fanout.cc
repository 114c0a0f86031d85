#include "daemon/publish/fanout.h"

#include <algorithm>
#include <functional>

namespace ckpt::daemon {
namespace {

// Appends `node` unless it is `self` or listed already.
void Add(std::vector<std::string>& order, const std::string& node,
         const std::string& self) {
  if (node.empty() || node == self) return;
  if (std::find(order.begin(), order.end(), node) == order.end()) {
    order.push_back(node);
  }
}

// `nodes` from a place that depends on `self` on, wrapping around.
std::vector<std::string> Rotated(std::vector<std::string> nodes,
                                 const std::string& self) {
  if (nodes.empty()) return nodes;
  const size_t start = std::hash<std::string>{}(self) % nodes.size();
  std::rotate(nodes.begin(), nodes.begin() + static_cast<long>(start),
              nodes.end());
  return nodes;
}

}  // namespace

int AutoDegree(size_t subscribers, uint64_t version_bytes) {
  const uint64_t pieces =
      (version_bytes + kFanoutPieceBytes - 1) / kFanoutPieceBytes;
  return subscribers <= std::max<uint64_t>(pieces, 1) ? 1 : 2;
}

std::vector<std::string> FetchOrder(const FanoutNodes& nodes,
                                    const std::string& self, int degree) {
  degree = std::max(degree, 1);
  // The tree: the source, then the subscribers in node order.
  std::vector<std::string> tree = {nodes.source};
  std::vector<std::string> subscribers = nodes.subscribers;
  std::sort(subscribers.begin(), subscribers.end());
  for (const std::string& node : subscribers) {
    if (node != nodes.source) tree.push_back(node);
  }
  auto at = std::find(tree.begin(), tree.end(), self);
  if (at == tree.end()) at = tree.insert(tree.end(), self);
  std::vector<std::string> order;
  // Up the tree to the source.
  for (size_t i = static_cast<size_t>(at - tree.begin()); i > 0;) {
    i = (i - 1) / static_cast<size_t>(degree);
    Add(order, tree[i], self);
  }
  std::vector<std::string> holders(nodes.holders.begin(), nodes.holders.end());
  for (const std::string& node : Rotated(std::move(holders), self)) {
    Add(order, node, self);
  }
  for (const std::string& node : Rotated(std::move(subscribers), self)) {
    Add(order, node, self);
  }
  return order;
}

}  // namespace ckpt::daemon
