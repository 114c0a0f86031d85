// Incremental saves across real ckptd processes on etcd: shards that store
// chunks in an earlier step's shard (directly, or through a shard that does)
// keep restoring bit-exact when that step is saved again (its commit records
// forgotten by another node's collection), because they are made
// self-contained first, newest first.
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/daemon/etcd_process.h"
#include "tests/test_util.h"
#include "tests/tools/run_cli.h"

namespace ckpt::client {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;
// 16 MiB per rank of 2: four 4 MiB chunks each.
constexpr int64_t kGlobal = 8 << 20;

bool Committed(Checkpointer& c, uint64_t step) {
  auto steps = c.ListCommitted(kDisk);
  return steps.ok() &&
         std::find(steps->begin(), steps->end(), step) != steps->end();
}

TEST(IncrementalNodesTest, AShardBuiltOnAStepSavedAgainIsMadeSelfContained) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  // Node b saves in full: a collection there may forget step 1's records
  // once step 2 is committed, though node a's step 2 still stores chunks in
  // its step 1.
  // No peer tier: what node b keeps is its memory and disk tiers' choice.
  auto node = [&](const std::string& id, std::vector<std::string> more) {
    std::vector<std::string> args = etcd.DaemonArgs();
    args.insert(args.end(), {"--lease-ttl", "2", "--node-id", id});
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  testing::DaemonProcess a(node("node-a", {})),
      b(node("node-b", {"--full-every", "1"}));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  Rank r0(a.socket(), "inc", 0, 2, kGlobal),
      r1(b.socket(), "inc", 1, 2, kGlobal);
  ASSERT_TRUE(r0.ckpt && r1.ckpt);
  absl::Status s = SaveAll({&r0, &r1}, 1, kDisk);
  ASSERT_TRUE(s.ok()) << s << a.log() << b.log();
  // Step 2: rank 0 changes only its last chunk; step 3 its first one too.
  // Step 3 then stores chunks in steps 1 and 2.
  std::vector<std::vector<float>> saved(4);
  for (uint64_t step : {2u, 3u}) {
    r1.Fill(step);
    const int64_t from = step == 2 ? r0.length - 16 : 0;
    for (int64_t i = from; i < from + 16; ++i) r0.w[i] = -1.0f * step * i;
    saved[step] = r0.w;
    r0.rng = absl::StrCat("rng-", step, "-0");
    std::vector<std::shared_ptr<SaveHandle>> saves;
    for (Rank* r : {&r0, &r1}) {
      auto save = r->ckpt->SaveAsync(step);
      ASSERT_TRUE(save.ok()) << save.status();
      saves.push_back(*save);
    }
    for (auto& save : saves) {
      ASSERT_TRUE(save->WaitCommitted(kDisk).ok()) << a.log() << b.log();
    }
  }
  EXPECT_THAT(a.log(), ContainsRegex("job inc step 2 rank 0: persisted [0-9]+ "
                                     "bytes \\([0-9]+ stored, [1-9][0-9]* "
                                     "unchanged in 1 base shards\\)"));
  EXPECT_THAT(a.log(), ContainsRegex("job inc step 3 rank 0: persisted [0-9]+ "
                                     "bytes \\([0-9]+ stored, [1-9][0-9]* "
                                     "unchanged in 2 base shards\\)"));
  // An operator's collection on node b keeps one step: it forgets step 1.
  Result gc = RunCli("--data-dir " + b.data_dir() +
                     " gc inc --keep 1 --socket " + b.socket());
  ASSERT_EQ(gc.exit_code, 0) << gc.out;
  for (int i = 0; i < 400 && Committed(*r0.ckpt, 1); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(Committed(*r0.ckpt, 1)) << gc.out << b.log();

  // Rank 0 saves step 1 again, with other values: its old step 1 goes, and
  // steps 3 and 2 are rewritten first with every chunk in them.
  r0.Fill(7);
  auto again = r0.ckpt->SaveAsync(1);
  ASSERT_TRUE(again.ok()) << again.status() << a.log();
  ASSERT_TRUE((*again)->WaitStaged().ok());
  const std::string detached =
      "job inc step 2 rank 0: made self-contained: step 1, which it stored "
      "chunks in, is being saved again";
  for (int i = 0;
       i < 400 && a.log().find("job inc step 1 rank 0: persisted",
                               a.log().find(detached)) == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(a.log(), HasSubstr(detached));
  EXPECT_THAT(a.log(), HasSubstr("job inc step 3 rank 0: made self-contained"));

  // Step 3 (still committed) restores as saved from disk, its memory copy
  // dropped first, and every copy on node a verifies, step 2's too (its
  // records went with node b's collection).
  Result dropped = RunCli("--data-dir " + a.data_dir() +
                          " gc inc --memory --socket " + a.socket());
  ASSERT_EQ(dropped.exit_code, 0) << dropped.out;
  auto reader = Checkpointer::Connect({.job = "inc",
                                       .rank = 0,
                                       .world_size = 2,
                                       .socket_path = a.socket(),
                                       .read_only = true});
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> w(r0.length);
  std::string rng;
  ASSERT_TRUE((*reader)
                  ->RegisterTensor("model/w", proto::DTYPE_FLOAT32, w.data(),
                                   {kGlobal}, {0}, {r0.length})
                  .ok());
  ASSERT_TRUE((*reader)->RegisterBytes("rng", &rng).ok());
  absl::Status restored = (*reader)->Restore(3);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << a.log();
  EXPECT_EQ(w, saved[3]);
  EXPECT_EQ(rng, "rng-3-0");
  Result verify = RunCli("--data-dir " + a.data_dir() + " verify inc");
  EXPECT_EQ(verify.exit_code, 0) << verify.out;
}

// Increments over the network: a node's replica of a rank is pushed once in
// full, then as increments (only the chunks the save stores) on top of the
// files the peer holds; after the peers restart, and with the owner killed,
// every committed step restores bit-exact on the node holding the replica
// (through its held bases) and on the third node (fetching the replica's
// self-contained form).
TEST(IncrementalNodesTest, ReplicasReceiveIncrementsAndRestoreAfterALoss) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  const std::vector<std::string> ids = {"node-a", "node-b", "node-c"};
  std::vector<std::unique_ptr<testing::DaemonProcess>> nodes;
  for (const std::string& id : ids) {
    nodes.push_back(std::make_unique<testing::DaemonProcess>(
        NodeArgs(etcd, id, {"--keep-memory", "4"})));
    ASSERT_TRUE(nodes.back()->Start()) << nodes.back()->log();
  }
  constexpr int64_t kWorld3 = 3 * (4 << 20);  // four 4 MiB chunks per rank
  std::vector<std::unique_ptr<Rank>> ranks;
  for (uint32_t r = 0; r < 3; ++r) {
    ranks.push_back(
        std::make_unique<Rank>(nodes[r]->socket(), "net", r, 3, kWorld3));
    ASSERT_TRUE(ranks.back()->ckpt);
  }
  // Step 1 in full; steps 2 to 4 change 16 values of one chunk each.
  std::vector<std::vector<std::vector<float>>> saved(5);
  for (uint64_t step = 1; step <= 4; ++step) {
    std::vector<std::shared_ptr<SaveHandle>> saves;
    for (auto& r : ranks) {
      if (step == 1) r->Fill(1);
      const int64_t from = static_cast<int64_t>(step % 4) * (r->length / 4);
      for (int64_t i = from; step > 1 && i < from + 16; ++i)
        r->w[i] = static_cast<float>(step * 1000 + i);
      r->rng = absl::StrCat("rng-", step, "-", r->rank);
      saved[step].push_back(r->w);
      auto save = r->ckpt->SaveAsync(step);
      ASSERT_TRUE(save.ok()) << save.status();
      saves.push_back(*save);
    }
    for (auto& save : saves) {
      absl::Status s = save->WaitCommitted(proto::TIER_PEER);
      ASSERT_TRUE(s.ok()) << s << nodes[0]->log();
    }
  }
  // Every node's replica of steps 2 to 4 arrived as an increment.
  std::string logs;
  for (auto& n : nodes) logs += n->log();
  for (uint64_t step = 2; step <= 4; ++step) {
    for (uint32_t r = 0; r < 3; ++r) {
      EXPECT_THAT(logs,
                  ContainsRegex(absl::StrCat(
                      "holding a replica of job net step ", step, " rank ", r,
                      " for node node-[abc] \\([0-9]+ bytes, an increment")))
          << "step " << step << " rank " << r;
    }
  }
  // Nodes b and c restart (SIGKILL): they adopt the replicas they held,
  // increments beside their bases. Then node a is lost: rank 0's steps
  // restore on b and c.
  ranks.clear();
  for (size_t n : {1u, 2u}) {
    nodes[n]->Kill();
    ASSERT_TRUE(nodes[n]->Start()) << nodes[n]->log();
  }
  nodes[0]->Kill();
  for (size_t n : {1u, 2u}) {
    for (uint64_t step = 1; step <= 4; ++step) {
      auto reader = Checkpointer::Connect({.job = "net",
                                           .rank = 0,
                                           .world_size = 3,
                                           .socket_path = nodes[n]->socket(),
                                           .read_only = true});
      ASSERT_TRUE(reader.ok()) << reader.status();
      std::vector<float> w(kWorld3 / 3);
      std::string rng;
      ASSERT_TRUE((*reader)
                      ->RegisterTensor("model/w", proto::DTYPE_FLOAT32,
                                       w.data(), {kWorld3}, {0}, {kWorld3 / 3})
                      .ok());
      ASSERT_TRUE((*reader)->RegisterBytes("rng", &rng).ok());
      absl::Status restored = (*reader)->Restore(step);
      ASSERT_TRUE(restored.ok())
          << restored << " on " << ids[n] << " step " << step << "\n"
          << nodes[n]->log();
      EXPECT_TRUE(w == saved[step][0]) << ids[n] << " step " << step;
      EXPECT_EQ(rng, absl::StrCat("rng-", step, "-0"));
    }
  }
}

}  // namespace
}  // namespace ckpt::client
