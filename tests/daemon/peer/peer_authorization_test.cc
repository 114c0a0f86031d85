// PeerAuthorization on its own: a parity contribution is held to the settled
// plan the coordinator gives (fetched once per step), a replica of a shard
// saved here is refused, and a replica held for one node is replaced only by
// that node (until it is no longer held).
#include "daemon/peer/peer_authorization.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

// rs:2+1 over ranks 0 and 1 on nodes a and b, parity on c.
proto::ParityPlan Plan() {
  proto::ParityPlan plan;
  plan.set_job("j");
  plan.set_step(7);
  proto::ParityGroup* g = plan.add_groups();
  g->set_group(0);
  g->set_stripe_bytes(4096);
  for (const auto& [rank, node] :
       std::vector<std::pair<uint32_t, std::string>>{{0, "a"}, {1, "b"}}) {
    proto::ShardHolder* h = g->add_data();
    h->set_rank(rank);
    h->set_node(node);
    h->set_file_bytes(4000);
  }
  g->add_parity_nodes("c");
  return plan;
}

proto::ParityBlockKey Block(uint64_t step) {
  proto::ParityBlockKey key;
  key.set_job("j");
  key.set_step(step);
  key.set_group(0);
  key.set_index(0);
  return key;
}

TEST(PeerAuthorizationTest, ContributionsAreHeldToTheSettledPlan) {
  int lookups = 0;
  PeerAuthorization auth(
      [&](const std::string& job,
          uint64_t step) -> absl::StatusOr<absl::optional<proto::ParityPlan>> {
        ++lookups;
        if (step != 7) return absl::optional<proto::ParityPlan>();
        return absl::optional<proto::ParityPlan>(Plan());
      },
      [](const std::string&, uint64_t, uint32_t) { return false; });
  const proto::ParityGroup group = Plan().groups(0);
  EXPECT_TRUE(auth.MayContribute(Block(7), group, 0, {"a"}).ok());
  EXPECT_TRUE(auth.MayContribute(Block(7), group, 1, {"b", "127.0.0.1"}).ok());
  // Without TLS nobody is known: the plan alone decides.
  EXPECT_TRUE(auth.MayContribute(Block(7), group, 1, {}).ok());
  absl::Status other = auth.MayContribute(Block(7), group, 0, {"b"});
  EXPECT_TRUE(absl::IsPermissionDenied(other)) << other;
  EXPECT_THAT(other.message(),
              HasSubstr("the parity plan has that block on node a"));
  proto::ParityGroup forged = group;
  forged.mutable_data(0)->set_node("b");
  absl::Status made_up = auth.MayContribute(Block(7), forged, 0, {"b"});
  EXPECT_TRUE(absl::IsPermissionDenied(made_up)) << made_up;
  EXPECT_THAT(made_up.message(), HasSubstr("does not have"));
  absl::Status beyond = auth.MayContribute(Block(7), group, 5, {});
  EXPECT_TRUE(absl::IsPermissionDenied(beyond)) << beyond;
  absl::Status early = auth.MayContribute(Block(8), group, 0, {"a"});
  EXPECT_TRUE(absl::IsFailedPrecondition(early)) << early;
  // The settled plan of step 7 was read once; step 8's (none yet) is asked
  // again next time.
  EXPECT_EQ(lookups, 2);
  (void)auth.MayContribute(Block(8), group, 0, {"a"});
  EXPECT_EQ(lookups, 3);
}

TEST(PeerAuthorizationTest, ReplicasOfOwnShardsAndOfOtherNodesAreRefused) {
  testing::TempDir dir;
  auto held =
      ReplicaStore::Open(io::DefaultFileSystem(), dir.File("held"), 64 << 20);
  ASSERT_TRUE(held.ok()) << held.status();
  PeerAuthorization auth(nullptr,
                         [](const std::string&, uint64_t, uint32_t rank) {
                           return rank == 0;  // rank 0 was saved here
                         });
  absl::Status own = auth.ClaimReplica({"j", 1, 0}, "b", **held).status();
  EXPECT_TRUE(absl::IsPermissionDenied(own)) << own;
  EXPECT_THAT(own.message(), HasSubstr("which this node saved itself"));
  // A replica of rank 1 from node b, held.
  const std::string src = dir.File("src.shard");
  snapshot::ShardWriter writer(io::DefaultFileSystem(), src, {"j", 1, 1, 2},
                               {});
  const std::vector<uint8_t> state(5000, 'x');
  ASSERT_TRUE(writer.AddBytes("state", state).ok());
  ASSERT_TRUE(writer.Commit().ok());
  const std::string bytes = testing::ReadAll(src);
  {
    auto claim = auth.ClaimReplica({"j", 1, 1}, "b", **held);
    ASSERT_TRUE(claim.ok()) << claim.status();
    // While b's push is in flight, c's push of the same shard is refused
    // (b may retry meanwhile).
    absl::Status racing = auth.ClaimReplica({"j", 1, 1}, "c", **held).status();
    EXPECT_TRUE(absl::IsPermissionDenied(racing)) << racing;
    EXPECT_THAT(racing.message(),
                HasSubstr("while node b's push of it is in flight"));
    EXPECT_TRUE(auth.ClaimReplica({"j", 1, 1}, "b", **held).ok());
    auto rx = (*held)->Receive({"j", 1, 1}, bytes.size());
    ASSERT_TRUE(rx.ok()) << rx.status();
    ASSERT_TRUE((*rx)->Append(bytes).ok());
    ASSERT_TRUE((*rx)->Finish().ok());
    auth.Held({"j", 1, 1}, "b", **held);
  }
  // b may push it again; c may not replace it.
  EXPECT_TRUE(auth.ClaimReplica({"j", 1, 1}, "b", **held).ok());
  absl::Status taken = auth.ClaimReplica({"j", 1, 1}, "c", **held).status();
  EXPECT_TRUE(absl::IsPermissionDenied(taken)) << taken;
  EXPECT_THAT(taken.message(), HasSubstr("which this node holds for node b"));
  // Once it is no longer held, anyone may send it again.
  ASSERT_TRUE((*held)->Drop({"j", 1, 1}).ok());
  EXPECT_TRUE(auth.ClaimReplica({"j", 1, 1}, "c", **held).ok());
}

}  // namespace
}  // namespace ckpt::daemon
