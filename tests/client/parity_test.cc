// The erasure-coded peer tier (--peer-redundancy rs:K+M) across real ckptd
// processes on loopback with a real etcd: a step commits at tier peer once
// every group's parity is in place, two lost nodes of one group (SIGKILL, their
// directories deleted) restore bit-exact from the parity, and a third loss,
// beyond what the code rebuilds, falls back to the shared tier with the reason
// in the log.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/peer.grpc.pb.h"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/client/peer_tls.h"
#include "tests/daemon/etcd_process.h"
#include "tests/test_util.h"
#include "tests/tools/run_cli.h"

namespace ckpt::client {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

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

// Five ckptd on one etcd with rs:2+2. Ranks 0, 1, 2 of a job save on nodes a,
// b, c: the plan (parity_plan.h) puts ranks 0 and 1 in group 0, with parity
// on c and d, and rank 2 alone in group 1, with parity on a and b.
struct FiveNodes {
  static constexpr int64_t kGlobal = 3 << 18;  // 1 MiB per rank of 3

  // `kill_point_c`: node c starts with CKPT_KILL_POINT set to it.
  ::testing::AssertionResult Start(const std::vector<std::string>& more = {},
                                   const std::string& kill_point_c = "") {
    if (!etcd.Start()) return ::testing::AssertionFailure() << etcd.log();
    std::vector<std::string> args = {"--peer-redundancy", "rs:2+2"};
    args.insert(args.end(), more.begin(), more.end());
    char id = 'a';
    for (testing::DaemonProcess* p : all()) {
      p->set_extra_args(NodeArgs(etcd, std::string("node-") + id++, args));
      const bool armed = p == &c && !kill_point_c.empty();
      if (armed) ::setenv("CKPT_KILL_POINT", kill_point_c.c_str(), 1);
      const bool started = p->Start();
      if (armed) ::unsetenv("CKPT_KILL_POINT");
      if (!started) return ::testing::AssertionFailure() << p->log();
    }
    return ::testing::AssertionSuccess();
  }
  // Saves `step` of ranks 0, 1, 2 on a, b, c; waits for tier peer.
  absl::Status Save(const std::string& job, uint64_t step) {
    Rank r0(a.socket(), job, 0, 3, kGlobal), r1(b.socket(), job, 1, 3, kGlobal),
        r2(c.socket(), job, 2, 3, kGlobal);
    if (!r0.ckpt || !r1.ckpt || !r2.ckpt) {
      return absl::UnavailableError("a rank did not connect");
    }
    return SaveAll({&r0, &r1, &r2}, step, kPeer);
  }
  std::vector<testing::DaemonProcess*> all() { return {&a, &b, &c, &d, &e}; }

  testing::EtcdProcess etcd;
  testing::DaemonProcess a, b, c, d, e;
};

// Restores `step` of `ranks` of `job` through `node`, one after another,
// each checked bit-exact.
void RestoreOn(testing::DaemonProcess& node, const std::string& job,
               std::vector<uint32_t> ranks, uint64_t step,
               const std::string& logs = "") {
  for (uint32_t rank : ranks) {
    Rank moved(node.socket(), job, rank, 3, FiveNodes::kGlobal);
    ASSERT_TRUE(moved.ckpt);
    absl::Status restored = moved.ckpt->Restore(step);
    ASSERT_TRUE(restored.ok()) << "rank " << rank << ": " << restored << "\n"
                               << node.log() << logs;
    EXPECT_TRUE(moved.Matches(step)) << "rank " << rank;
  }
}

// Waits up to 20 s for `text` in the logs of every one of `nodes`.
::testing::AssertionResult LogsShow(std::vector<testing::DaemonProcess*> nodes,
                                    const std::string& text) {
  for (int i = 0; i < 400; ++i) {
    bool all = true;
    for (testing::DaemonProcess* p : nodes) {
      all = all && p->log().find(text) != std::string::npos;
    }
    if (all) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  failure << "no \"" << text << "\" in";
  for (testing::DaemonProcess* p : nodes) failure << "\n" << p->log();
  return failure;
}

TEST(ParityTest, TwoLostNodesOfAGroupRestoreFromParityAThirdFallsBack) {
  testing::TempDir shared;
  FiveNodes nodes;
  ASSERT_TRUE(
      nodes.Start({"--shared-dir", shared.File("t3"), "--shared-every", "1"}));
  auto& [etcd, a, b, c, d, e] = nodes;
  constexpr int64_t kGlobal = FiveNodes::kGlobal;
  for (uint64_t step = 1; step <= 2; ++step) {
    absl::Status s = nodes.Save("par", step);
    ASSERT_TRUE(s.ok()) << s << "\n" << a.log() << b.log() << c.log();
  }
  EXPECT_THAT(a.log() + b.log() + c.log(),
              ContainsRegex("job par step 2: parity plan rs:2\\+2 made: 2 "
                            "groups"));
  EXPECT_THAT(a.log(), HasSubstr("protected by rs:2+2 parity (group 0 of 2"));
  // Parity held in peer memory: one stripe per parity block, against two
  // full replicas of every shard for the same two losses.
  uint64_t parity = 0, shards = 0;
  for (testing::DaemonProcess* p : nodes.all()) {
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
  RestoreOn(e, "par", {0, 1}, 2);
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

  // Rank 0's rebuild decoded rank 1 too, from the same blocks.
  EXPECT_THAT(e.log(), HasSubstr("(2 shards of it)"));

  // Nodes c and e (which keeps the rebuilt copies) go too: group 0 has one
  // block left (parity on d), fewer than the two it needs. A restore on d
  // falls back to the shared tier.
  c.Lose();
  e.Lose();
  Rank again(d.socket(), "par", 1, 3, kGlobal);
  ASSERT_TRUE(again.ckpt);
  absl::Status restored = again.ckpt->Restore(2);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << d.log();
  EXPECT_TRUE(again.Matches(2));
  EXPECT_THAT(d.log(), ContainsRegex("cannot rebuild it from rs:2\\+2 group 0 "
                                     "of job par step 2: 1 of the 2 blocks "
                                     "needed could be had"));
}

TEST(ParityTest, ADataNodeKilledMidEncodeLeavesTheStepShortOfTierPeer) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  auto node = [&](const std::string& id) {
    return NodeArgs(etcd, id, {"--peer-redundancy", "rs:2+1"});
  };
  // Ranks 0 and 1 on a and b form the one group; its parity goes to c.
  testing::DaemonProcess a(node("node-a")), b(node("node-b")),
      c(node("node-c"));
  // Node a dies once it sent the first MiB of its contribution.
  ::setenv("CKPT_KILL_POINT", "parity.segment_sent", 1);
  const bool started = a.Start();
  ::unsetenv("CKPT_KILL_POINT");
  ASSERT_TRUE(started) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  ASSERT_TRUE(c.Start()) << c.log();
  constexpr int64_t kGlobal = 2 << 20;  // 4 MiB per rank of 2
  Rank r1(b.socket(), "cut", 1, 2, kGlobal);
  ASSERT_TRUE(r1.ckpt);
  std::shared_ptr<SaveHandle> save1;
  {
    Rank r0(a.socket(), "cut", 0, 2, kGlobal);
    ASSERT_TRUE(r0.ckpt);
    r0.Fill(1);
    r1.Fill(1);
    auto save0 = r0.ckpt->SaveAsync(1);
    auto save = r1.ckpt->SaveAsync(1);
    ASSERT_TRUE(save0.ok() && save.ok());
    save1 = *std::move(save);
    ASSERT_TRUE(save1->WaitCommitted(proto::TIER_LOCAL_DISK).ok())
        << a.log() << b.log();
    for (int i = 0; i < 200 && a.Accepting(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    ASSERT_FALSE(a.Accepting()) << a.log();
  }
  // What a sent does not count: the block it cut into is emptied, and the
  // step never reaches tier peer without it.
  EXPECT_FALSE(save1->WaitCommitted(kPeer, absl::Seconds(3)).ok());
  auto on_peers = r1.ckpt->ListCommitted(kPeer);
  ASSERT_TRUE(on_peers.ok());
  EXPECT_TRUE(on_peers->empty());
  EXPECT_THAT(c.log(), HasSubstr("contribution was cut short"));
  // Node a returns with its disk: its shard is protected again, and b's
  // contribution, which went with the emptied block, is sent again too.
  a.Kill();
  ASSERT_TRUE(a.Start()) << a.log();
  absl::Status protected_now = save1->WaitCommitted(kPeer, absl::Seconds(60));
  ASSERT_TRUE(protected_now.ok()) << protected_now << "\n"
                                  << a.log() << b.log() << c.log();
  EXPECT_THAT(a.log(), HasSubstr("job cut step 1 rank 0: protected by rs:2+1"));
}

TEST(ParityTest, AFlippedByteInAParityBlockIsCaughtByTheChunkChecksums) {
  FiveNodes nodes;
  ASSERT_TRUE(nodes.Start());
  auto& [etcd, a, b, c, d, e] = nodes;
  constexpr int64_t kGlobal = FiveNodes::kGlobal;
  absl::Status saved = nodes.Save("flip", 1);
  ASSERT_TRUE(saved.ok()) << saved;
  // One bit of parity block 0 of group 0, in node c's memory, flips.
  const std::string block =
      c.replica_dir() + "/parity/flip/00000000000000000001-g000000-p00.parity";
  ASSERT_TRUE(std::filesystem::exists(block)) << c.log();
  {
    std::fstream f(block, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(std::filesystem::file_size(block) / 2));
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x04;
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(block) / 2));
    f.write(&byte, 1);
  }
  // `ckpt verify` on node c finds it: the block no longer hashes to what it
  // did when it completed. Node d's blocks are intact.
  Result verify = RunCli("--data-dir " + c.data_dir() + " verify flip");
  EXPECT_EQ(verify.exit_code, 1) << verify.out;
  EXPECT_THAT(verify.out,
              HasSubstr("BAD parity step 1 group 0 block 0: parity block 0 of "
                        "group 0 of job flip step 1: its bytes changed since "
                        "it completed"));
  Result fine = RunCli("--data-dir " + d.data_dir() + " verify flip --json");
  EXPECT_EQ(fine.exit_code, 0) << fine.out;
  EXPECT_THAT(fine.out, HasSubstr("\"tier\": \"parity\""));
  a.Lose();
  b.Lose();
  // Rank 0 decodes from both parity blocks: the decoded file fails its
  // checks, and no wrong byte reaches the trainer.
  Rank moved(e.socket(), "flip", 0, 3, kGlobal);
  ASSERT_TRUE(moved.ckpt);
  absl::Status restored = moved.ckpt->Restore(1);
  ASSERT_FALSE(restored.ok()) << "restored from a damaged parity block";
  EXPECT_THAT(restored.message(), HasSubstr("rank 0"));
  EXPECT_THAT(e.log(), HasSubstr("job flip step 1 rank 0: the file rebuilt "
                                 "from parity fails its checks"))
      << e.log();
  EXPECT_FALSE(moved.Matches(1));
}

TEST(ParityTest, ALostParityHolderIsReplacedAndTheGroupSurvivesTwoMoreLosses) {
  FiveNodes nodes;
  ASSERT_TRUE(nodes.Start());
  auto& [etcd, a, b, c, d, e] = nodes;
  absl::Status saved = nodes.Save("again", 1);
  ASSERT_TRUE(saved.ok()) << saved;
  // Node c, which holds parity block 0 of group 0, is lost: once its lease
  // expires, a and b make that block again on e (the one node outside the
  // group).
  c.Lose();
  const std::string redone =
      "protected again by rs:2+2 parity (group 0: "
      "block 0 on node-e for node-c)";
  ASSERT_TRUE(LogsShow({&a, &b}, redone));
  auto metrics = GetMetricsText(a.socket());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, ContainsRegex("ckpt_parity_reprotected_total\\{job="
                                      "\"again\"\\} 1"));
  metrics = GetMetricsText(e.socket());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, ContainsRegex("ckpt_parity_bytes [1-9]"));
  // Two more losses, a and b: group 0 decodes from e's block and d's.
  a.Lose();
  b.Lose();
  RestoreOn(d, "again", {0, 1}, 1);
  EXPECT_THAT(d.log(), HasSubstr("rebuilt"));
}

TEST(ParityTest, ALostDataNodeIsRebuiltOnAStandInAndTheGroupSurvivesTwoMore) {
  FiveNodes nodes;
  ASSERT_TRUE(nodes.Start());
  auto& [etcd, a, b, c, d, e] = nodes;
  absl::Status saved = nodes.Save("stand", 1);
  ASSERT_TRUE(saved.ok()) << saved;
  // Node a (rank 0, data block 0 of group 0) is lost: once its lease
  // expires, e (the one node with no block of group 0) rebuilds rank 0 from
  // b's shard and a parity block, before any restore asks, and keeps it.
  a.Lose();
  const std::string ahead =
      "job stand step 1 rank 0: lost with node node-a, rebuilt ahead of any "
      "restore and kept here in its place (rs:2+2 group 0)";
  ASSERT_TRUE(LogsShow({&e}, ahead));
  auto metrics = GetMetricsText(e.socket());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, ContainsRegex("ckpt_parity_stand_in_shards_total\\{"
                                      "job=\"stand\"\\} 1"));
  // What operators see of it.
  Result status = RunCli("--data-dir " + e.data_dir() + " status --socket " +
                         e.socket() + " --json");
  ASSERT_EQ(status.exit_code, 0) << status.out;
  EXPECT_THAT(status.out, ContainsRegex("\"parity_stand_in_shards\": 1"));
  EXPECT_THAT(status.out, ContainsRegex("\"parity_rebuilt_bytes\": [1-9]"));
  EXPECT_THAT(status.out, HasSubstr("\"parity_held_bytes\""));
  Result human =
      RunCli("--data-dir " + e.data_dir() + " status --socket " + e.socket());
  EXPECT_THAT(human.out, HasSubstr("1 rebuilt on this node as a stand-in"));
  // Two more of group 0 lost, b (rank 1) and c (parity block 0): only d's
  // parity block is left of the group's own, one of the two needed; e's
  // copy of rank 0 is the other.
  b.Lose();
  c.Lose();
  RestoreOn(d, "stand", {1, 0}, 1, e.log());
  EXPECT_THAT(d.log(), HasSubstr("job stand step 1 rank 1: rebuilt"));
}

// With --reprotect-delay, a loss leaves the network and the cores to the
// restores that follow it: no stand-in rebuilds the lost shard and no parity
// is made again meanwhile, so the group is decoded once, by the restore.
TEST(ParityTest, RestoresComeFirstAndReprotectionWaitsForItsDelay) {
  FiveNodes nodes;
  ASSERT_TRUE(nodes.Start({"--reprotect-delay", "600"}));
  auto& [etcd, a, b, c, d, e] = nodes;
  absl::Status saved = nodes.Save("first", 1);
  ASSERT_TRUE(saved.ok()) << saved;
  // Node a (rank 0, data block 0 of group 0; parity block 0 of group 1) is
  // lost.
  a.Lose();
  const std::string later =
      "node node-a lost: what it held is made again in 10m (--reprotect-delay)";
  ASSERT_TRUE(LogsShow({&b, &c, &d, &e}, later));
  RestoreOn(d, "first", {0}, 1);
  EXPECT_THAT(d.log(), HasSubstr("job first step 1 rank 0: rebuilt"));
  for (testing::DaemonProcess* p : {&b, &c, &d, &e}) {
    EXPECT_THAT(p->log(), Not(HasSubstr("rebuilt ahead of any restore")));
    EXPECT_THAT(p->log(), Not(HasSubstr("protected again")));
  }
}

// A rebuild streams its blocks through rings the decode frees as it goes. A
// block cut short (its node dies as it starts sending) stops the others'
// transfers, blocked on full rings, and the rebuild starts over with another
// block of the group in its place.
TEST(ParityTest, ABlockCutShortMidRebuildIsReplacedByAnother) {
  FiveNodes nodes;
  ASSERT_TRUE(nodes.Start({"--reprotect-delay", "600"}, "bulk.sending"));
  auto& [etcd, a, b, c, d, e] = nodes;
  // 16 MiB per rank: twice what a ring holds.
  constexpr int64_t kBig = 3 << 22;
  {
    Rank r0(a.socket(), "cut", 0, 3, kBig), r1(b.socket(), "cut", 1, 3, kBig),
        r2(c.socket(), "cut", 2, 3, kBig);
    ASSERT_TRUE(r0.ckpt && r1.ckpt && r2.ckpt);
    absl::Status saved = SaveAll({&r0, &r1, &r2}, 1, kPeer);
    ASSERT_TRUE(saved.ok()) << saved << a.log() << c.log();
  }
  ASSERT_TRUE(c.Accepting()) << "node c sent a bulk transfer while saving";
  // Rank 0 rebuilds on e from b's shard and c's parity block, the first
  // ones it asks for; c dies sending its block, and d's takes its place.
  a.Lose();
  Rank moved(e.socket(), "cut", 0, 3, kBig);
  ASSERT_TRUE(moved.ckpt);
  absl::Status restored = moved.ckpt->Restore(1);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << e.log();
  EXPECT_TRUE(moved.Matches(1));
  EXPECT_FALSE(c.Accepting());
  EXPECT_THAT(e.log(),
              ContainsRegex("job cut step 1 rank 0: .*parity block 0 \\(on "
                            "node node-c\\)"));
  EXPECT_THAT(e.log(), HasSubstr("job cut step 1 rank 0: rebuilt"));
}

// Node c saves rank 2's step 2 ahead of the others, then is lost with it. Its
// vote and holder record for step 2 outlive it in etcd; when the job resumes
// from step 1, rank 2 (on c's replacement) withdraws them, so the others'
// new saves of step 2 neither commit it without rank 2 nor plan its parity
// with the lost copy.
TEST(ParityTest, ALostNodesVotesForNewerStepsAreWithdrawnWhenTheJobResumes) {
  FiveNodes nodes;
  ASSERT_TRUE(nodes.Start());
  auto& [etcd, a, b, c, d, e] = nodes;
  constexpr int64_t kGlobal = FiveNodes::kGlobal;
  absl::Status saved = nodes.Save("stale", 1);
  ASSERT_TRUE(saved.ok()) << saved;
  {
    Rank ahead(c.socket(), "stale", 2, 3, kGlobal);
    ASSERT_TRUE(ahead.ckpt);
    ahead.Fill(2);
    auto save = ahead.ckpt->SaveAsync(2);
    ASSERT_TRUE(save.ok()) << save.status();
    ASSERT_TRUE((*save)->WaitStaged().ok());
  }
  ASSERT_TRUE(LogsShow({&c}, "job stale step 2 rank 2: persisted"));
  c.Lose();
  ASSERT_TRUE(c.Start()) << c.log();
  // The job resumes from step 1 on a, b and c's replacement.
  Rank r0(a.socket(), "stale", 0, 3, kGlobal),
      r1(b.socket(), "stale", 1, 3, kGlobal),
      r2(c.socket(), "stale", 2, 3, kGlobal);
  ASSERT_TRUE(r0.ckpt && r1.ckpt && r2.ckpt);
  for (Rank* r : {&r0, &r1, &r2}) {
    absl::Status restored = r->ckpt->Restore(1);
    ASSERT_TRUE(restored.ok()) << restored << "\n" << c.log();
    EXPECT_TRUE(r->Matches(1));
  }
  EXPECT_THAT(c.log(), HasSubstr("job stale step 2 rank 2: its vote, cast for "
                                 "a copy this node does not have, withdrawn"));
  // Ranks 0 and 1 alone do not commit step 2 at any tier.
  std::vector<std::shared_ptr<SaveHandle>> saves;
  for (Rank* r : {&r0, &r1}) {
    r->Fill(2);
    auto save = r->ckpt->SaveAsync(2);
    ASSERT_TRUE(save.ok()) << save.status();
    saves.push_back(*save);
  }
  ASSERT_TRUE(LogsShow({&a}, "job stale step 2 rank 0: persisted"));
  ASSERT_TRUE(LogsShow({&b}, "job stale step 2 rank 1: persisted"));
  for (proto::Tier tier : {proto::TIER_MEMORY, proto::TIER_LOCAL_DISK}) {
    auto latest = r0.ckpt->LatestCommitted(tier);
    ASSERT_TRUE(latest.ok()) << latest.status();
    EXPECT_EQ(latest->value_or(0), 1u)
        << "step 2 committed with the lost node's vote";
  }
  // Rank 2's new save completes it, up to tier peer (its parity planned with
  // the new copy), and a restore elsewhere is bit-exact.
  ASSERT_TRUE(SaveAll({&r2}, 2, kPeer).ok()) << c.log();
  for (auto& save : saves) {
    ASSERT_TRUE(save->WaitCommitted(kPeer).ok()) << a.log() << c.log();
  }
  EXPECT_THAT(c.log(), HasSubstr("job stale step 2 rank 2: protected by"));
  c.Lose();
  RestoreOn(d, "stale", {2}, 2, e.log());
}

// A parity contribution's first piece, sent as node `from`.
grpc::Status Contribute(proto::CkptPeer::Stub* stub,
                        const proto::ParityBlockKey& key,
                        const proto::ParityGroup& group, uint32_t position,
                        const std::string& from) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::PushParityResponse resp;
  auto writer = stub->PushParity(&ctx, &resp);
  proto::ParityPiece piece;
  *piece.mutable_block() = key;
  *piece.mutable_group() = group;
  piece.set_position(position);
  piece.set_from_node(from);
  piece.set_data("forged");
  writer->Write(piece);
  writer->WritesDone();
  return writer->Finish();
}

// With mutual TLS, a parity block takes only what the step's plan (the
// coordinator's) assigns: a node contributing a data block another node
// holds, a group the plan does not have, a step without a plan are refused by
// name, and the block stays whole.
TEST(ParityTest, AContributionThePlanDoesNotAssignIsRefused) {
  Pki pki;
  ASSERT_TRUE(pki.Make("ca", {"node-a", "node-b", "node-c"}));
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  auto node = [&](const std::string& id) {
    std::vector<std::string> more = pki.Args("ca", id);
    more.insert(more.end(), {"--peer-redundancy", "rs:2+1"});
    return NodeArgs(etcd, id, more);
  };
  // Ranks 0 and 1 on a and b form the one group; its parity goes to c.
  testing::DaemonProcess a(node("node-a")), b(node("node-b")),
      c(node("node-c"));
  for (testing::DaemonProcess* p : {&a, &b, &c}) {
    ASSERT_TRUE(p->Start()) << p->log();
  }
  constexpr int64_t kGlobal = 1 << 18;
  Rank r0(a.socket(), "plan", 0, 2, kGlobal),
      r1(b.socket(), "plan", 1, 2, kGlobal);
  ASSERT_TRUE(r0.ckpt && r1.ckpt);
  absl::Status saved = SaveAll({&r0, &r1}, 1, kPeer);
  ASSERT_TRUE(saved.ok()) << saved << a.log() << b.log() << c.log();
  auto stub = proto::CkptPeer::NewStub(
      TlsChannel(PeerAddress(c.log()), pki.Client("ca", "node-b"), "node-c"));
  proto::ParityBlockRequest req;
  req.mutable_block()->set_job("plan");
  req.mutable_block()->set_step(1);
  auto block_state = [&]() {
    grpc::ClientContext ctx;
    proto::ParityBlockState state;
    EXPECT_TRUE(stub->GetParityBlock(&ctx, req, &state).ok());
    return state;
  };
  const proto::ParityBlockState before = block_state();
  ASSERT_TRUE(before.held() && before.record().complete());
  const proto::ParityGroup& group = before.record().group();
  uint32_t of_a = 0;
  while (group.data(of_a).node() != "node-a") ++of_a;
  // Node b, as itself, contributing node a's block.
  grpc::Status not_its =
      Contribute(stub.get(), req.block(), group, of_a, "node-b");
  EXPECT_EQ(not_its.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(not_its.error_message(), HasSubstr("comes from node-b"));
  EXPECT_THAT(not_its.error_message(),
              HasSubstr("the parity plan has that block on node node-a"));
  // A group of its own making.
  proto::ParityGroup forged = group;
  forged.set_stripe_bytes(group.stripe_bytes() + 4096);
  grpc::Status made_up =
      Contribute(stub.get(), req.block(), forged, 1 - of_a, "node-b");
  EXPECT_EQ(made_up.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(made_up.error_message(),
              HasSubstr("names a group the step's parity plan does not have"));
  // A step nobody saved.
  proto::ParityBlockKey unplanned = req.block();
  unplanned.set_step(9);
  grpc::Status early =
      Contribute(stub.get(), unplanned, group, 1 - of_a, "node-b");
  EXPECT_EQ(early.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(early.error_message(), HasSubstr("has no parity plan"));
  // Nothing of it reached the block.
  const proto::ParityBlockState after = block_state();
  EXPECT_TRUE(after.held() && after.record().complete());
  EXPECT_EQ(after.record().SerializeAsString(),
            before.record().SerializeAsString());
  EXPECT_THAT(c.log(), HasSubstr("peer service: refused a call from"));
}

}  // namespace
}  // namespace ckpt::client
