// Peer replication (tier T1) across real ckptd processes on loopback with a
// real etcd: the shards of a node that is lost (SIGKILL, its directories
// deleted) restore on another node from the replicas, at the same and at
// another world size; a peer killed in the middle of receiving a replica holds
// nothing that counts, and replication reaches K once it returns; with mutual
// TLS, peers replicate to each other and a client without a good certificate
// is refused at the handshake.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/peer.grpc.pb.h"
#include "snapshot/format.h"
#include "snapshot/shard_writer.h"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/client/peer_tls.h"
#include "tests/daemon/etcd_process.h"
#include "tests/test_util.h"
#include "tests/tools/run_cli.h"

namespace ckpt::client {
namespace {

using ::testing::HasSubstr;

constexpr proto::Tier kPeer = proto::TIER_PEER;

size_t FilesUnder(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); ++it) {
    if (it->is_regular_file()) ++n;
  }
  return n;
}

TEST(ReplicationTest, ALostNodesShardsRestoreFromReplicasOnAnotherNode) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  testing::DaemonProcess a(NodeArgs(etcd, "node-a")),
      b(NodeArgs(etcd, "node-b")), c(NodeArgs(etcd, "node-c"));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  ASSERT_TRUE(c.Start()) << c.log();
  constexpr int64_t kGlobal = 1 << 21;  // 4 MiB per rank of 2
  {
    Rank r0(a.socket(), "rep", 0, 2, kGlobal),
        r1(b.socket(), "rep", 1, 2, kGlobal);
    ASSERT_TRUE(r0.ckpt && r1.ckpt);
    for (uint64_t step = 1; step <= 2; ++step) {
      absl::Status s = SaveAll({&r0, &r1}, step, kPeer);
      ASSERT_TRUE(s.ok()) << s << "\n" << a.log() << b.log();
    }
    auto on_peers = r0.ckpt->ListCommitted(kPeer);
    ASSERT_TRUE(on_peers.ok());
    EXPECT_THAT(*on_peers, ::testing::Contains(2u));
    // The replication figures move: bytes pushed (rate = bytes/s), the
    // replicas node a holds for b.
    auto metrics = GetMetricsText(a.socket());
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_THAT(*metrics,
                ::testing::ContainsRegex(
                    "ckpt_replicated_bytes_total\\{job=\"rep\"\\} [1-9]"));
    EXPECT_THAT(*metrics, ::testing::ContainsRegex("ckpt_replica_bytes [1-9]"));
  }
  // `ckpt ls` on node a: the commits are etcd's (both ranks' votes), the
  // shards node a's own.
  Result ls = RunCli("--data-dir " + a.data_dir() + " ls rep --json --socket " +
                     a.socket());
  ASSERT_EQ(ls.exit_code, 0) << ls.out;
  nlohmann::json j = nlohmann::json::parse(ls.out, nullptr, false);
  ASSERT_EQ(j["steps"].size(), 2u) << ls.out;
  EXPECT_EQ(j["commits_from"], "ckptd");
  EXPECT_THAT(j["steps"][1]["committed"].get<std::vector<std::string>>(),
              ::testing::UnorderedElementsAre("memory", "peer", "local_disk"));
  EXPECT_EQ(j["steps"][1]["ranks_on_peers"], 1);
  Result human =
      RunCli("--data-dir " + a.data_dir() + " ls rep --socket " + a.socket());
  EXPECT_THAT(human.out, ::testing::ContainsRegex("2 +2 +committed +committed "
                                                  "+committed +- "));
  // Node a is lost with everything it had: daemon, memory tier, disk.
  a.Lose();

  // Its rank restarts on node c, at the same world size.
  Rank moved(c.socket(), "rep", 0, 2, kGlobal);
  ASSERT_TRUE(moved.ckpt);
  absl::Status restored = moved.ckpt->Restore(2);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << c.log();
  EXPECT_TRUE(moved.Matches(2));
  // The whole job on node c alone (world 1): both saved ranks' boxes.
  Rank alone(c.socket(), "rep", 0, 1, kGlobal);
  ASSERT_TRUE(alone.ckpt);
  restored = alone.ckpt->Restore(2);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << c.log();
  EXPECT_TRUE(alone.Matches(2, /*rng_too=*/false));
  EXPECT_EQ(alone.rng, "rng-2-0");
  // And on node b at world 4, whose ranks each read a part of a saved box.
  for (uint32_t rank = 0; rank < 4; ++rank) {
    Rank quarter(b.socket(), "rep", rank, 4, kGlobal);
    ASSERT_TRUE(quarter.ckpt);
    restored = quarter.ckpt->Restore(2);
    ASSERT_TRUE(restored.ok()) << "rank " << rank << ": " << restored;
    EXPECT_TRUE(quarter.Matches(2, /*rng_too=*/false)) << "rank " << rank;
  }
  EXPECT_THAT(c.log() + b.log(), HasSubstr("over a bulk transfer"));
  // The dry run on node c: the lost rank 0 from node b's replica (or the copy
  // c fetched), rank 1 from a copy here or on b; nothing is fetched for it.
  Result plan =
      RunCli("--data-dir " + c.data_dir() +
             " restore-plan rep 2 --world 1 --json --socket " + c.socket());
  ASSERT_EQ(plan.exit_code, 0) << plan.out;
  nlohmann::json pj = nlohmann::json::parse(plan.out, nullptr, false);
  EXPECT_EQ(pj["complete"], true) << plan.out;
  EXPECT_EQ(pj["saved_world"], 2) << plan.out;
  std::set<uint32_t> saved_ranks;
  for (const nlohmann::json& piece : pj["ranks"][0]["tensors"][0]["pieces"]) {
    saved_ranks.insert(piece["saved_rank"].get<uint32_t>());
    EXPECT_THAT(piece["source"].get<std::string>(),
                ::testing::AnyOf(::testing::StartsWith("replica_here"),
                                 ::testing::StartsWith("peer_")))
        << plan.out;
  }
  EXPECT_EQ(saved_ranks, (std::set<uint32_t>{0, 1})) << plan.out;
  // A shard nobody has gets an error naming it and the peers asked.
  Rank late(c.socket(), "rep", 0, 2, kGlobal);
  ASSERT_TRUE(late.ckpt);
  absl::Status missing = late.ckpt->Restore(3);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.message(), HasSubstr("step 3"));
}

TEST(ReplicationTest, APeerKilledMidTransferHoldsNothingAndKIsReachedLater) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  testing::DaemonProcess a(NodeArgs(etcd, "node-a")),
      b(NodeArgs(etcd, "node-b"));
  ASSERT_TRUE(a.Start()) << a.log();
  // Node b dies when the second piece of the first replica arrives.
  ::setenv("CKPT_KILL_POINT", "peer.piece_received:2", 1);
  const bool started = b.Start();
  ::unsetenv("CKPT_KILL_POINT");
  ASSERT_TRUE(started) << b.log();
  Rank r(a.socket(), "cut", 0, 1, 1 << 21);  // an 8 MiB shard file
  ASSERT_TRUE(r.ckpt);
  r.Fill(1);
  auto save = r.ckpt->SaveAsync(1);
  ASSERT_TRUE(save.ok()) << save.status();
  ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok()) << a.log();
  // b died mid-transfer: the step is not committed at T1.
  for (int i = 0; i < 200 && b.Accepting(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_FALSE(b.Accepting()) << b.log();
  EXPECT_FALSE((*save)->WaitCommitted(kPeer, absl::Seconds(2)).ok());
  auto on_peers = r.ckpt->ListCommitted(kPeer);
  ASSERT_TRUE(on_peers.ok());
  EXPECT_TRUE(on_peers->empty());
  b.Kill();  // reap it
  EXPECT_EQ(FilesUnder(b.replica_dir() + "/held"), 1u)
      << "the partial file a killed peer leaves";
  // b returns: the partial file is dropped and the push is made again.
  ASSERT_TRUE(b.Start()) << b.log();
  absl::Status replicated = (*save)->WaitCommitted(kPeer, absl::Seconds(60));
  ASSERT_TRUE(replicated.ok()) << replicated << "\n" << a.log() << b.log();
  EXPECT_THAT(b.log(), HasSubstr("not a complete replica"));
  EXPECT_EQ(FilesUnder(b.replica_dir() + "/held"), 1u);
  EXPECT_TRUE(std::filesystem::exists(
      b.replica_dir() + "/held/cut/00000000000000000001-0000000000.ckpt"));
}

// K is kept: when the node holding a shard's replica dies, the owner pushes
// the shard to another peer once the dead node's lease expired.
TEST(ReplicationTest, AReplicaLostWithItsNodeIsMadeAgainElsewhere) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  testing::DaemonProcess a(NodeArgs(etcd, "node-a")),
      b(NodeArgs(etcd, "node-b")), c(NodeArgs(etcd, "node-c"));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  ASSERT_TRUE(c.Start()) << c.log();
  Rank r(a.socket(), "again", 0, 1, 1 << 16);
  ASSERT_TRUE(r.ckpt);
  absl::Status s = SaveAll({&r}, 1, kPeer);
  ASSERT_TRUE(s.ok()) << s << "\n" << a.log();
  auto held = [](const testing::DaemonProcess& d) {
    return FilesUnder(d.replica_dir() + "/held");
  };
  ASSERT_EQ(held(b) + held(c), 1u) << "K = 1: one replica";
  testing::DaemonProcess& holder = held(b) == 1 ? b : c;
  testing::DaemonProcess& other = held(b) == 1 ? c : b;
  holder.Kill();
  for (int i = 0; i < 400 && held(other) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(held(other), 1u) << a.log();
  EXPECT_THAT(a.log(), HasSubstr("replicating again"));
}

// A node that comes back under the same id is another start of it: a
// replacement machine without the replicas gets them pushed again at once (its
// lease has not even expired); a restarted daemon that kept them on tmpfs is
// asked and not sent them again.
TEST(ReplicationTest, ANodeBackUnderItsIdIsCheckedForItsReplicas) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  testing::DaemonProcess a(NodeArgs(etcd, "node-a")),
      b(NodeArgs(etcd, "node-b"));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  Rank r(a.socket(), "back", 0, 1, 1 << 16);
  ASSERT_TRUE(r.ckpt);
  absl::Status s = SaveAll({&r}, 1, kPeer);
  ASSERT_TRUE(s.ok()) << s << "\n" << a.log();
  const std::string replica =
      b.replica_dir() + "/held/back/00000000000000000001-0000000000.ckpt";
  ASSERT_TRUE(std::filesystem::exists(replica));
  auto wait_for = [](const std::function<bool()>& done) {
    for (int i = 0; i < 600 && !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return done();
  };
  // Replaced: the new machine under the same id has nothing.
  b.Lose();
  ASSERT_TRUE(b.Start()) << b.log();
  EXPECT_TRUE(wait_for([&] { return std::filesystem::exists(replica); }))
      << a.log();
  EXPECT_THAT(a.log(), HasSubstr("left or restarted; replicating again"));
  // Restarted with its replicas: counted as they are.
  b.Kill();
  ASSERT_TRUE(b.Start()) << b.log();
  EXPECT_TRUE(wait_for([&] {
    return a.log().find("node node-b still holds its replica") !=
           std::string::npos;
  })) << a.log();
  EXPECT_TRUE(std::filesystem::exists(replica));
  // Either way the lost owner's step restores from b.
  a.Lose();
  Rank moved(b.socket(), "back", 0, 1, 1 << 16);
  ASSERT_TRUE(moved.ckpt);
  absl::Status restored = moved.ckpt->Restore(1);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << b.log();
  EXPECT_TRUE(moved.Matches(1));
}

// Flips one byte in the middle of a file (inside a chunk's stored bytes).
void FlipMiddleByte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff at = f.tellg() / 2;
  f.seekg(at);
  char c;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x20));
}

// `ckpt verify` on a node checks, beside its own shards, the replicas it holds
// for its peers and the shared tier's copies, and names a flipped byte in
// either by tier, step, rank and file.
TEST(ReplicationTest, CkptVerifyChecksHeldReplicasAndTheSharedTier) {
  testing::TempDir shared;
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  const std::vector<std::string> more = {"--shared-dir", shared.File("t3"),
                                         "--shared-every", "1"};
  testing::DaemonProcess a(NodeArgs(etcd, "node-a", more)),
      b(NodeArgs(etcd, "node-b", more));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  {
    Rank r0(a.socket(), "v", 0, 2, 1 << 18), r1(b.socket(), "v", 1, 2, 1 << 18);
    ASSERT_TRUE(r0.ckpt && r1.ckpt);
    for (uint64_t step = 1; step <= 2; ++step) {
      absl::Status s = SaveAll({&r0, &r1}, step, proto::TIER_SHARED);
      if (s.ok()) s = SaveAll({}, step, kPeer);
      ASSERT_TRUE(s.ok()) << s << "\n" << a.log() << b.log();
      auto peer = r0.ckpt->LatestCommitted(kPeer);
      for (int i = 0; i < 400 && !(peer.ok() && *peer == step); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
        peer = r0.ckpt->LatestCommitted(kPeer);
      }
      ASSERT_TRUE(peer.ok() && *peer == step) << a.log() << b.log();
    }
  }
  const std::string on_b = "--data-dir " + b.data_dir() + " ";
  Result ls = RunCli(on_b + "ls v --json");
  ASSERT_EQ(ls.exit_code, 0) << ls.out;
  nlohmann::json listed = nlohmann::json::parse(ls.out, nullptr, false);
  EXPECT_THAT(
      listed["steps"][1]["committed"].get<std::vector<std::string>>(),
      ::testing::IsSupersetOf({"memory", "peer", "local_disk", "shared"}));
  Result ok = RunCli(on_b + "verify v --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.out;
  nlohmann::json j = nlohmann::json::parse(ok.out, nullptr, false);
  std::map<std::string, int> copies;
  for (const nlohmann::json& c : j["copies"]) copies[c["tier"]]++;
  // Node a's rank 0 of the newest peer-committed step, at least (retention
  // keeps the replicas of the newest --keep-memory peer commits).
  EXPECT_GE(copies["peer"], 1) << ok.out;
  EXPECT_EQ(copies["shared"], 4) << ok.out;
  FlipMiddleByte(b.replica_dir() +
                 "/held/v/00000000000000000002-0000000000.ckpt");
  FlipMiddleByte(shared.File("t3/v/00000000000000000001-0000000001.ckpt"));
  Result bad = RunCli(on_b + "verify v");
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("BAD peer step 2 rank 0"));
  EXPECT_THAT(bad.out, HasSubstr("BAD shared step 1 rank 1"));
  EXPECT_THAT(bad.out, HasSubstr("00000000000000000002-0000000000.ckpt"));
  EXPECT_THAT(bad.out, HasSubstr("chunk"));
}

// A rank restarted on a node with no copy of its shard streams the file from
// the peer holding the replica straight into its tensors (no landing copy on
// node c); a replica with a flipped byte is refused, however it travels.
TEST(ReplicationTest, ARankMovedToANodeWithoutACopyStreamsItFromThePeer) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  const std::vector<std::string> keep = {"--keep-memory", "2"};
  testing::DaemonProcess a(NodeArgs(etcd, "node-a", keep)),
      b(NodeArgs(etcd, "node-b", keep)), c(NodeArgs(etcd, "node-c", keep));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  constexpr int64_t kGlobal = 1 << 21;
  {
    Rank r0(a.socket(), "stream", 0, 2, kGlobal),
        r1(b.socket(), "stream", 1, 2, kGlobal);
    ASSERT_TRUE(r0.ckpt && r1.ckpt);
    for (uint64_t step = 1; step <= 2; ++step) {
      absl::Status s = SaveAll({&r0, &r1}, step, kPeer);
      ASSERT_TRUE(s.ok()) << s << "\n" << a.log() << b.log();
    }
  }
  a.Lose();
  // Node c replaces it: it has no copy of anything.
  ASSERT_TRUE(c.Start()) << c.log();
  FlipMiddleByte(b.replica_dir() +
                 "/held/stream/00000000000000000002-0000000000.ckpt");
  Rank moved(c.socket(), "stream", 0, 2, kGlobal);
  ASSERT_TRUE(moved.ckpt);
  // The stream is refused at the flipped chunk; so is the copy node c
  // fetches next.
  absl::Status bad = moved.ckpt->Restore(2);
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  EXPECT_THAT(c.log(), HasSubstr("step 2 rank 0: fetched"));

  absl::Status restored = moved.ckpt->Restore(1);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << c.log();
  EXPECT_TRUE(moved.Matches(1));
  auto metrics = GetMetricsText(c.socket());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics,
              ::testing::ContainsRegex("ckpt_restored_bytes_total\\{job="
                                       "\"stream\",source=\"peer_stream\"\\} "
                                       "[1-9]"));
  // Nothing of step 1 landed in node c's memory on the way.
  EXPECT_THAT(c.log(), ::testing::Not(HasSubstr("step 1 rank 0: fetched")));
}

// The only copy of rank 1's shard is on node b (no replicas), and b restarts:
// a restore of rank 1 on node a waits for it (ckptd says b may be restarting:
// registered but not answering, then lost less than --reprotect-delay ago)
// and completes bit-exact once b is back; with b gone for good, the restore
// gives up after its wait, naming b.
TEST(ReplicationTest, ARestoreWaitsForARestartingNodeWithTheOnlyCopy) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  auto args = [&](const std::string& node) {
    std::vector<std::string> a =
        NodeArgs(etcd, node, {"--reprotect-delay", "30"});
    *(std::find(a.begin(), a.end(), "--peer-replicas") + 1) = "0";
    return a;
  };
  testing::DaemonProcess a(args("node-a")), b(args("node-b"));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  constexpr int64_t kGlobal = 1 << 20;
  {
    Rank r0(a.socket(), "wait", 0, 2, kGlobal),
        r1(b.socket(), "wait", 1, 2, kGlobal);
    ASSERT_TRUE(r0.ckpt && r1.ckpt);
    for (uint64_t step = 1; step <= 2; ++step) {
      ASSERT_TRUE(SaveAll({&r0, &r1}, step, proto::TIER_LOCAL_DISK).ok());
    }
  }
  b.Kill();
  Rank moved(a.socket(), "wait", 1, 2, kGlobal);
  ASSERT_TRUE(moved.ckpt);
  std::atomic<bool> done{false};
  absl::Status restored;
  std::thread restore([&] {
    restored = moved.ckpt->Restore(1);
    done = true;
  });
  // Past b's lease (2 s): b is lost, and awaited.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  EXPECT_FALSE(done) << restored;
  ASSERT_TRUE(b.Start()) << b.log();
  restore.join();
  ASSERT_TRUE(restored.ok()) << restored << "\n" << a.log();
  EXPECT_TRUE(moved.Matches(1));

  b.Kill();
  CheckpointerOptions impatient{"wait", 1, 2, a.socket()};
  impatient.restore_peer_wait = absl::Seconds(2);
  Rank gone(a.socket(), "wait", 1, 2, kGlobal);
  gone.ckpt = ConnectRank(impatient, {gone.w.data(), gone.global, gone.offset,
                                      gone.length, &gone.rng});
  ASSERT_TRUE(gone.ckpt);
  // Step 1 of rank 1 is cached on a now; step 2 only b has.
  absl::Status refused = gone.ckpt->Restore(2);
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("node-b"));
  EXPECT_THAT(refused.message(), HasSubstr("may be restarting"));
}

// Tier T3: node a copies every second step to a shared directory; once node a
// is lost with its directories, node b restores those steps from the shared
// copies, at the same and at another world size, and names what is missing.
TEST(ReplicationTest, TheSharedTierServesTheStepsOfALostNode) {
  testing::TempDir shared;
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  std::vector<std::string> args = etcd.DaemonArgs();
  args.insert(args.end(),
              {"--lease-ttl", "2", "--shared-dir", shared.File("t3"),
               "--shared-every", "2", "--keep-shared", "2"});
  auto with_id = [&](const std::string& id) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--node-id", id});
    return a;
  };
  testing::DaemonProcess a(with_id("node-a")), b(with_id("node-b"));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  constexpr int64_t kGlobal = 1 << 18;
  {
    Rank r0(a.socket(), "t3", 0, 2, kGlobal),
        r1(a.socket(), "t3", 1, 2, kGlobal);
    ASSERT_TRUE(r0.ckpt && r1.ckpt);
    for (uint64_t step = 1; step <= 6; ++step) {
      absl::Status s =
          SaveAll({&r0, &r1}, step,
                  step % 2 == 0 ? proto::TIER_SHARED : proto::TIER_LOCAL_DISK);
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s << "\n" << a.log();
    }
    auto on_shared = r0.ckpt->ListCommitted(proto::TIER_SHARED);
    ASSERT_TRUE(on_shared.ok());
    EXPECT_THAT(*on_shared, ::testing::IsSupersetOf({4u, 6u}));
    EXPECT_THAT(*on_shared, ::testing::Not(::testing::Contains(3u)));
  }
  // Retention keeps the newest two shared steps: 4 and 6, two ranks each,
  // and their commit markers (what the tier alone says is committed).
  for (int i = 0; i < 100 && FilesUnder(shared.File("t3")) != 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(FilesUnder(shared.File("t3")), 6u);
  EXPECT_TRUE(std::filesystem::exists(
      shared.File("t3/t3/00000000000000000006-0000000001.ckpt")));
  for (const char* marker : {"t3/t3/00000000000000000004.commit",
                             "t3/t3/00000000000000000006.commit"}) {
    proto::CommitRecord commit;
    EXPECT_TRUE(commit.ParseFromString(testing::ReadAll(shared.File(marker))))
        << marker;
    EXPECT_EQ(commit.world_size(), 2u) << marker;
  }
  a.Lose();
  Rank same(b.socket(), "t3", 1, 2, kGlobal);
  ASSERT_TRUE(same.ckpt);
  absl::Status restored = same.ckpt->Restore(6);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << b.log();
  EXPECT_TRUE(same.Matches(6));
  Rank alone(b.socket(), "t3", 0, 1, kGlobal);
  ASSERT_TRUE(alone.ckpt);
  restored = alone.ckpt->Restore(4);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << b.log();
  EXPECT_TRUE(alone.Matches(4, /*rng_too=*/false));
  // Step 5 was never copied: the error names the shard and the shared tier.
  absl::Status missing = same.ckpt->Restore(5);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.message(), HasSubstr("step 5"));
  EXPECT_THAT(missing.message(), HasSubstr("shared tier"));
}

grpc::Status Locate(const std::string& address,
                    std::shared_ptr<grpc::ChannelCredentials> creds) {
  auto stub =
      proto::CkptPeer::NewStub(grpc::CreateChannel(address, std::move(creds)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::LocateShardRequest req;
  req.mutable_shard()->set_job("tls");
  proto::LocateShardResponse resp;
  return stub->LocateShard(&ctx, req, &resp);
}

grpc::Status LocateVia(std::shared_ptr<grpc::Channel> channel) {
  auto stub = proto::CkptPeer::NewStub(std::move(channel));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::LocateShardRequest req;
  req.mutable_shard()->set_job("tls");
  proto::LocateShardResponse resp;
  return stub->LocateShard(&ctx, req, &resp);
}

// A replica push of a few bytes that claims to come from `from_node`.
grpc::Status PushClaiming(std::shared_ptr<grpc::Channel> channel,
                          const std::string& from_node) {
  auto stub = proto::CkptPeer::NewStub(std::move(channel));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::PushReplicaResponse resp;
  auto writer = stub->PushReplica(&ctx, &resp);
  proto::ReplicaPiece piece;
  piece.mutable_shard()->set_job("tls");
  piece.mutable_shard()->set_step(1);
  piece.set_file_bytes(4);
  piece.set_from_node(from_node);
  piece.set_data("ckpt");
  writer->Write(piece);
  writer->WritesDone();
  return writer->Finish();
}

TEST(ReplicationTest, MutualTlsReplicatesAndRefusesClientsWithoutAGoodCert) {
  Pki pki;
  ASSERT_TRUE(pki.Make("good", {"node-a", "node-b", "node-c", "node-x"}))
      << "tools/ckpt-certs failed";
  ASSERT_TRUE(pki.Make("rogue", {"node-a"})) << "tools/ckpt-certs failed";
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  testing::DaemonProcess a(
      NodeArgs(etcd, "node-a", pki.Args("good", "node-a"))),
      b(NodeArgs(etcd, "node-b", pki.Args("good", "node-b")));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  Rank r(a.socket(), "tls", 0, 1, 1 << 16);
  ASSERT_TRUE(r.ckpt);
  absl::Status s = SaveAll({&r}, 1, kPeer);
  ASSERT_TRUE(s.ok()) << s << "\n" << a.log() << b.log();
  const std::string address = PeerAddress(b.log());
  ASSERT_FALSE(address.empty()) << b.log();
  EXPECT_THAT(b.log(), HasSubstr("with mutual TLS"));
  // A node of the cluster with its own certificate gets in.
  const grpc::SslCredentialsOptions as_a = pki.Client("good", "node-a");
  EXPECT_TRUE(LocateVia(TlsChannel(address, as_a, "node-b")).ok());
  // b's certificate names b: a client that expects another node there (a
  // node answering at an address another one published) does not talk to it.
  EXPECT_FALSE(LocateVia(TlsChannel(address, as_a, "node-c")).ok());
  // No TLS at all, TLS without a client certificate, a certificate of
  // another CA: refused before any call.
  EXPECT_FALSE(Locate(address, grpc::InsecureChannelCredentials()).ok());
  grpc::SslCredentialsOptions anonymous;
  anonymous.pem_root_certs = as_a.pem_root_certs;
  EXPECT_FALSE(LocateVia(TlsChannel(address, anonymous, "node-b")).ok());
  grpc::SslCredentialsOptions rogue = pki.Client("rogue", "node-a");
  rogue.pem_root_certs = as_a.pem_root_certs;
  EXPECT_FALSE(LocateVia(TlsChannel(address, rogue, "node-b")).ok());
  // A certificate of the right CA for a node the coordinator does not know.
  grpc::Status stranger =
      LocateVia(TlsChannel(address, pki.Client("good", "node-x"), "node-b"));
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(stranger.error_message(), HasSubstr("no node of this cluster"));
  // A node of the cluster claiming to be another: its push is refused, and
  // b holds nothing it pushed.
  grpc::Status forged =
      PushClaiming(TlsChannel(address, as_a, "node-b"), "node-c");
  EXPECT_EQ(forged.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(forged.error_message(),
              HasSubstr("says it comes from node node-c, but the peer's "
                        "certificate names node-a"));
  EXPECT_THAT(b.log(), HasSubstr("claiming to be node node-c"));
  // A restore on a third node fetches the lost node's shard from b inside
  // TLS: bulk transfers (plain TCP) are off, the bytes stream over gRPC.
  testing::DaemonProcess c(
      NodeArgs(etcd, "node-c", pki.Args("good", "node-c")));
  ASSERT_TRUE(c.Start()) << c.log();
  // A node of the cluster, as itself, may still push only what it is given
  // to: not a replica of a shard the receiver saved itself, nor one of a
  // replica the receiver holds for another node.
  const std::string address_a = PeerAddress(a.log());
  grpc::Status own = PushClaiming(
      TlsChannel(address_a, pki.Client("good", "node-b"), "node-a"), "node-b");
  EXPECT_EQ(own.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(own.error_message(),
              HasSubstr("node node-b sent a replica of job tls step 1 rank 0, "
                        "which this node saved itself"));
  grpc::Status taken = PushClaiming(
      TlsChannel(address, pki.Client("good", "node-c"), "node-b"), "node-c");
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(taken.error_message(),
              HasSubstr("which this node holds for node node-a"));
  a.Lose();
  Rank moved(c.socket(), "tls", 0, 1, 1 << 16);
  ASSERT_TRUE(moved.ckpt);
  absl::Status restored = moved.ckpt->Restore(1);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << c.log();
  EXPECT_TRUE(moved.Matches(1));
  EXPECT_THAT(c.log(), HasSubstr("over gRPC"));
  // Half a TLS configuration is refused with a clear error.
  testing::DaemonProcess half(
      NodeArgs(etcd, "node-h", {"--peer-tls-ca", pki.File("good", "ca.pem")}));
  EXPECT_FALSE(half.Start());
  EXPECT_THAT(half.log(), HasSubstr("--peer-tls-ca, --peer-tls-cert"));
}

// Without TLS the peer service listens only on loopback, unless the operator
// says the network is trusted (and is warned at every start).
TEST(ReplicationTest, APublicPeerAddressWithoutTlsIsRefused) {
  testing::DaemonProcess open({"--peer-address", "0.0.0.0:0"});
  EXPECT_FALSE(open.Start());
  EXPECT_THAT(open.log(), HasSubstr("--peer-address 0.0.0.0:0 is reachable "
                                    "from other hosts and peer TLS is off"));
  EXPECT_THAT(open.log(), HasSubstr("tools/ckpt-certs"));
  EXPECT_THAT(open.log(), HasSubstr("--peer-insecure"));
  testing::DaemonProcess trusted(
      {"--peer-address", "0.0.0.0:0", "--peer-insecure"});
  ASSERT_TRUE(trusted.Start()) << trusted.log();
  EXPECT_THAT(trusted.log(), HasSubstr("--peer-insecure: the peer service on "
                                       "0.0.0.0:0 runs without TLS"));
}

// PullReplica makes the receiving node connect out: only to the address the
// call comes from, never to one the caller names.
TEST(ReplicationTest, PullReplicaDialsOnlyItsCaller) {
  testing::DaemonProcess a({"--peer-address", "127.0.0.1:0"});
  ASSERT_TRUE(a.Start()) << a.log();
  const std::string address = PeerAddress(a.log());
  ASSERT_FALSE(address.empty()) << a.log();
  auto stub = proto::CkptPeer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::PullReplicaRequest req;
  req.mutable_shard()->set_job("pull");
  req.mutable_shard()->set_step(1);
  req.set_file_bytes(4);
  req.set_from_node("node-z");
  req.set_host("192.0.2.1");  // TEST-NET-1: anyone's choice of target
  req.set_port(80);
  req.set_ticket(std::string(16, 'x'));
  proto::PushReplicaResponse resp;
  grpc::Status s = stub->PullReplica(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(),
              HasSubstr("PullReplica names host \"192.0.2.1\", which is not "
                        "the address the call comes from"));
}

// A push that announces a size and then sends nothing holds the room it
// reserved only until the peer idle timeout: then it is cancelled, and the
// room serves the next push.
TEST(ReplicationTest, APushThatStallsIsCancelledAndReleasesItsRoom) {
  testing::DaemonProcess a({"--peer-address", "127.0.0.1:0",
                            "--peer-idle-timeout", "1", "--replica-budget",
                            "1M"});
  ASSERT_TRUE(a.Start()) << a.log();
  const std::string address = PeerAddress(a.log());
  ASSERT_FALSE(address.empty()) << a.log();
  auto stub = proto::CkptPeer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  // Opens a push of the whole budget, sends its first 4 bytes, then stalls.
  struct Stalled {
    grpc::ClientContext ctx;
    proto::PushReplicaResponse resp;
    std::unique_ptr<grpc::ClientWriter<proto::ReplicaPiece>> writer;
  };
  auto stall = [&stub](uint64_t step) {
    auto s = std::make_unique<Stalled>();
    s->ctx.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(120));
    s->writer = stub->PushReplica(&s->ctx, &s->resp);
    proto::ReplicaPiece piece;
    piece.mutable_shard()->set_job("stall");
    piece.mutable_shard()->set_step(step);
    piece.set_file_bytes(1 << 20);
    piece.set_from_node("node-z");
    piece.set_data("ckpt");
    s->writer->Write(piece);
    return s;
  };
  // Two pushes of the whole budget: whichever reaches the server first
  // (under load that need not be the one opened first) takes the room and
  // is cut off at the idle timeout; the other is refused at once.
  std::unique_ptr<Stalled> first = stall(1);
  std::unique_ptr<Stalled> second = stall(2);
  const grpc::Status one = first->writer->Finish();
  const grpc::Status two = second->writer->Finish();
  const std::multiset<grpc::StatusCode> codes = {one.error_code(),
                                                 two.error_code()};
  EXPECT_EQ(codes, (std::multiset<grpc::StatusCode>{
                       grpc::StatusCode::CANCELLED,
                       grpc::StatusCode::RESOURCE_EXHAUSTED}))
      << one.error_message() << " / " << two.error_message();
  EXPECT_THAT(a.log(), HasSubstr("cancelling a replica push from"));
  // The room is free again once the cancelled call has unwound on the
  // server (which may be just after its client heard CANCELLED): a push of
  // the whole budget gets it, and is cut off the same way.
  grpc::Status again;
  for (uint64_t step = 3; step < 100; ++step) {
    std::unique_ptr<Stalled> next = stall(step);
    again = next->writer->Finish();
    if (again.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(again.error_code(), grpc::StatusCode::CANCELLED)
      << again.error_message();
}

// With a cluster key, a shard whose manifest the key did not seal is refused
// wherever it shows up: a forged replica pushed by a client (its checksums
// right) is never held, and a node's own file altered on disk is not read by
// a restore, which takes a peer's replica instead.
TEST(ReplicationTest, ShardsWithoutTheClusterKeysSealAreRefusedAtEveryTier) {
  testing::TempDir keys;
  const std::string key = keys.File("cluster.key");
  testing::WriteAll(key, std::string(64, 'c') + "\n");
  ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  testing::DaemonProcess a(NodeArgs(etcd, "node-a", {"--cluster-key", key})),
      b(NodeArgs(etcd, "node-b", {"--cluster-key", key}));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  EXPECT_THAT(a.log(), HasSubstr("manifests sealed with cluster key"));
  constexpr int64_t kGlobal = 1 << 14;
  Rank r(a.socket(), "sealed", 0, 1, kGlobal);
  ASSERT_TRUE(r.ckpt);
  absl::Status s = SaveAll({&r}, 1, kPeer);
  ASSERT_TRUE(s.ok()) << s << "\n" << a.log() << b.log();

  // A forged replica pushed to b: refused, and b holds nothing of it.
  const std::string forged = keys.File("forged.shard");
  ASSERT_TRUE(WriteForged(forged, "forged", 1, kGlobal, 7.0f).ok());
  const std::string bytes = testing::ReadAll(forged);
  const std::string address = PeerAddress(b.log());
  ASSERT_FALSE(address.empty()) << b.log();
  auto stub = proto::CkptPeer::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    proto::PushReplicaResponse resp;
    auto writer = stub->PushReplica(&ctx, &resp);
    proto::ReplicaPiece piece;
    piece.mutable_shard()->set_job("forged");
    piece.mutable_shard()->set_step(1);
    piece.set_file_bytes(bytes.size());
    piece.set_from_node("node-a");
    piece.set_data(bytes);
    writer->Write(piece);
    writer->WritesDone();
    grpc::Status pushed = writer->Finish();
    EXPECT_EQ(pushed.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(pushed.error_message(), HasSubstr("manifest is not sealed"));
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    proto::LocateShardRequest req;
    req.mutable_shard()->set_job("forged");
    req.mutable_shard()->set_step(1);
    proto::LocateShardResponse resp;
    ASSERT_TRUE(stub->LocateShard(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.tier(), proto::TIER_UNSPECIFIED);
  }

  // a's own file rewritten on disk, its checksums recomputed, while a is
  // down and its memory tier gone (a reboot): the restore refuses it and
  // reads b's replica.
  a.Kill();
  std::filesystem::remove_all(a.staging_dir());
  const std::string own = a.data_dir() + "/shards/sealed/" +
                          snapshot::ShardFileName(1, 0, ".shard");
  ASSERT_TRUE(std::filesystem::exists(own)) << own;
  ASSERT_TRUE(WriteForged(own, "sealed", 1, kGlobal, 7.0f).ok());
  ASSERT_TRUE(a.Start()) << a.log();
  Rank back(a.socket(), "sealed", 0, 1, kGlobal);
  ASSERT_TRUE(back.ckpt);
  back.Fill(99);
  absl::Status restored = back.ckpt->Restore(1);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << a.log();
  EXPECT_TRUE(back.Matches(1));
  EXPECT_THAT(a.log(), HasSubstr("manifest is not sealed"));
}

}  // namespace
}  // namespace ckpt::client
