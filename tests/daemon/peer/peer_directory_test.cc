// Who is in the cluster, against a real (embedded) coordinator: a node that
// published itself since the last listing is found by asking again; a name
// no node published is not a member; an older listing never replaces a newer.
#include "daemon/peer/peer_directory.h"

#include "daemon/catalog/kv_store.h"
#include "daemon/coord/embedded_coordinator.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

proto::PeerInfo Peer(const std::string& node, const std::string& address) {
  proto::PeerInfo p;
  p.set_node_id(node);
  p.set_address(address);
  return p;
}

TEST(PeerDirectoryTest, MembersAreWhatTheCoordinatorListsLast) {
  testing::TempDir dir;
  auto store = KvStore::Open(dir.File("db"));
  ASSERT_TRUE(store.ok()) << store.status();
  EmbeddedCoordinator coordinator(store->get());
  PeerDirectory directory(&coordinator, "node-a");
  EXPECT_TRUE(directory.IsMember("node-a"));  // itself
  EXPECT_FALSE(directory.IsMember("node-b"));
  EXPECT_FALSE(directory.IsMember(""));

  // Published after the last listing: a miss asks again.
  ASSERT_TRUE(coordinator.PublishPeer(Peer("node-b", "10.0.0.2:7070")).ok());
  EXPECT_TRUE(directory.IsMember("node-b"));
  EXPECT_EQ(directory.NodeAt("10.0.0.2:7070"), "node-b");
  EXPECT_EQ(directory.NodeAt("10.0.0.9:7070"), "");
  EXPECT_FALSE(directory.IsMember("10.0.0.2"));

  // A newer listing is taken; an older one never replaces it.
  const absl::Time before = absl::Now() - absl::Hours(1);
  directory.Learn({Peer("node-c", "10.0.0.3:7070")}, absl::Now());
  EXPECT_EQ(directory.NodeAt("10.0.0.3:7070"), "node-c");
  directory.Learn({Peer("node-d", "10.0.0.4:7070")}, before);
  EXPECT_TRUE(directory.IsMember("node-c"));
}

}  // namespace
}  // namespace ckpt::daemon
