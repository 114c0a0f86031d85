// The erasure-coded peer tier (--peer-redundancy rs:K+M) across real ckptd
// processes on loopback with a real etcd: a step commits at tier peer once
// every group's parity is in place, two lost nodes of one group (SIGKILL, their
// directories deleted) restore bit-exact from the parity, and a third loss,
// beyond what the code rebuilds, falls back to the shared tier with the reason
// in the log.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/daemon/etcd_process.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

constexpr proto::Tier kPeer = proto::TIER_PEER;

uint64_t BytesUnder(const std::string& dir, const std::string& suffix) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); ++it) {
    if (it->is_regular_file() && it->path().string().ends_with(suffix)) {
      n += it->file_size();
    }
  }
  return n;
}

TEST(ParityTest, TwoLostNodesOfAGroupRestoreFromParityAThirdFallsBack) {
  testing::TempDir shared;
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  auto node = [&](const std::string& id) {
    return NodeArgs(etcd.endpoint(), id,
                    {"--peer-redundancy", "rs:2+2", "--shared-dir",
                     shared.File("t3"), "--shared-every", "1"});
  };
  // Ranks 0, 1, 2 save on nodes a, b, c. The plan (parity_plan.h) puts
  // ranks 0 and 1 in group 0, with parity on c and d; rank 2 alone in
  // group 1, with parity on a and b.
  testing::DaemonProcess a(node("node-a")), b(node("node-b")),
      c(node("node-c")), d(node("node-d")), e(node("node-e"));
  for (testing::DaemonProcess* p : {&a, &b, &c, &d, &e}) {
    ASSERT_TRUE(p->Start()) << p->log();
  }
  constexpr int64_t kGlobal = 3 << 18;  // 1 MiB per rank of 3
  {
    Rank r0(a.socket(), "par", 0, 3, kGlobal),
        r1(b.socket(), "par", 1, 3, kGlobal),
        r2(c.socket(), "par", 2, 3, kGlobal);
    ASSERT_TRUE(r0.ckpt && r1.ckpt && r2.ckpt);
    for (uint64_t step = 1; step <= 2; ++step) {
      absl::Status s = SaveAll({&r0, &r1, &r2}, step, kPeer);
      ASSERT_TRUE(s.ok()) << s << "\n" << a.log() << b.log() << c.log();
    }
  }
  EXPECT_THAT(a.log() + b.log() + c.log(),
              ContainsRegex("job par step 2: parity plan rs:2\\+2 made: 2 "
                            "groups"));
  EXPECT_THAT(a.log(), HasSubstr("protected by rs:2+2 parity (group 0 of 2"));
  // Parity held in peer memory: one stripe per parity block, against two
  // full replicas of every shard for the same two losses.
  uint64_t parity = 0, shards = 0;
  for (testing::DaemonProcess* p : {&a, &b, &c, &d, &e}) {
    parity += BytesUnder(p->replica_dir() + "/parity/par", ".parity");
    shards += BytesUnder(p->data_dir() + "/shards/par", ".shard");
  }
  ASSERT_GT(shards, 0u);
  // Steps 1 and 2 may both be held (retention keeps the newest step at tier
  // peer and newer ones); per step, 4 stripes of about a shard each.
  EXPECT_GT(parity, 0u);
  EXPECT_LE(parity, 2 * shards) << "no more than two replicas would take";

  // Nodes a and b, which held ranks 0 and 1 (all of group 0's data), are
  // lost with everything they had.
  a.Lose();
  b.Lose();
  for (uint32_t rank : {0u, 1u}) {
    Rank moved(e.socket(), "par", rank, 3, kGlobal);
    ASSERT_TRUE(moved.ckpt);
    absl::Status restored = moved.ckpt->Restore(2);
    ASSERT_TRUE(restored.ok()) << "rank " << rank << ": " << restored << "\n"
                               << e.log();
    EXPECT_TRUE(moved.Matches(2)) << "rank " << rank;
  }
  EXPECT_THAT(e.log(), ContainsRegex("job par step 2 rank 0: rebuilt [0-9]+ "
                                     "bytes from rs:2\\+2 group 0"));
  auto metrics = GetMetricsText(e.socket());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, ContainsRegex("ckpt_parity_rebuilt_bytes_total\\{job="
                                      "\"par\"\\} [1-9]"));
  // Rank 2's node is alive: it restores from its own memory tier.
  {
    Rank r2(c.socket(), "par", 2, 3, kGlobal);
    ASSERT_TRUE(r2.ckpt);
    ASSERT_TRUE(r2.ckpt->Restore(2).ok());
    EXPECT_TRUE(r2.Matches(2));
  }

  // Node c goes too: group 0 has one block left (parity on d), fewer than
  // the two it needs. A restore on d falls back to the shared tier.
  c.Lose();
  Rank again(d.socket(), "par", 1, 3, kGlobal);
  ASSERT_TRUE(again.ckpt);
  absl::Status restored = again.ckpt->Restore(2);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << d.log();
  EXPECT_TRUE(again.Matches(2));
  EXPECT_THAT(d.log(), ContainsRegex("cannot rebuild it from rs:2\\+2 group 0 "
                                     "of job par step 2: 1 of the 2 blocks "
                                     "needed could be had"));
}

}  // namespace
}  // namespace ckpt::client
