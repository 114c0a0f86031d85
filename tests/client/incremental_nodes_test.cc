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

}  // namespace
}  // namespace ckpt::client
