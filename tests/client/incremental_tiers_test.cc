// Increments on every tier at once, across real ckptd processes on etcd:
// three nodes save increments (unchanged chunks left out, changed ones as XOR
// deltas) that their peers hold as replicas and the shared tier keeps as
// copies, through a node killed in the middle of a step and restarted, the
// job resuming from its last committed step and saving the next steps again
// (their earlier votes withdrawn, the copies built on them replaced), and the
// loss of a node with its directories. Every committed step restores
// bit-exact from its nodes' own tiers, from the peers and from the shared
// tier alone.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/status_macros.h"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/daemon/etcd_process.h"
#include "tests/test_util.h"
#include "tests/tools/run_cli.h"

namespace ckpt::client {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

constexpr uint32_t kWorld = 3;
// Two 4 MiB chunks per rank.
constexpr int64_t kGlobal = kWorld * (2 << 20);
constexpr int64_t kPerRank = kGlobal / kWorld;

// What each rank saved at each step, as the job saw it last.
struct Saved {
  std::map<uint64_t, std::vector<std::vector<float>>> w;
  std::map<uint64_t, std::vector<std::string>> rng;
};

// Saves `step` on every rank and waits until it is committed on the shared
// tier and at tier peer.
absl::Status SaveEverywhere(std::vector<std::unique_ptr<Rank>>& ranks,
                            uint64_t step, Saved* saved) {
  std::vector<std::shared_ptr<SaveHandle>> saves;
  saved->w.erase(step);
  saved->rng.erase(step);
  for (auto& r : ranks) {
    r->rng = absl::StrCat("rng-", step, "-", r->rank, "-", r->w[0]);
    saved->w[step].push_back(r->w);
    saved->rng[step].push_back(r->rng);
    auto save = r->ckpt->SaveAsync(step);
    if (!save.ok()) return save.status();
    saves.push_back(*std::move(save));
  }
  for (auto& s : saves) {
    for (proto::Tier tier : {proto::TIER_SHARED, proto::TIER_PEER}) {
      absl::Status st = s->WaitCommitted(tier, absl::Seconds(60));
      if (!st.ok()) {
        return absl::Status(st.code(), absl::StrCat("step ", step, " at ",
                                                    proto::Tier_Name(tier),
                                                    ": ", st.message()));
      }
    }
  }
  return absl::OkStatus();
}

// Changes every value of one chunk of a rank a little (the chunk becomes an
// XOR delta of the save before), the other chunk not at all.
void Train(Rank& r, uint64_t step, float rate = 1e-4f) {
  const int64_t from = static_cast<int64_t>(step % 2) * (kPerRank / 2);
  for (int64_t i = from; i < from + kPerRank / 2; ++i) {
    r.w[i] *= 1.0f + rate * static_cast<float>(step);
  }
}

// Restores `rank`'s shard of `step` through the ckptd at `socket` into fresh
// buffers and compares it with what was saved.
absl::Status RestoredAsSaved(const std::string& socket, uint32_t rank,
                             uint64_t step, const Saved& saved) {
  auto reader = Checkpointer::Connect({.job = "tiers",
                                       .rank = rank,
                                       .world_size = kWorld,
                                       .socket_path = socket,
                                       .read_only = true});
  if (!reader.ok()) return reader.status();
  std::vector<float> w(kPerRank);
  std::string rng;
  RETURN_IF_ERROR((*reader)->RegisterTensor("model/w", proto::DTYPE_FLOAT32,
                                            w.data(), {kGlobal},
                                            {kPerRank * rank}, {kPerRank}));
  RETURN_IF_ERROR((*reader)->RegisterBytes("rng", &rng));
  RETURN_IF_ERROR((*reader)->Restore(step));
  if (w != saved.w.at(step)[rank] || rng != saved.rng.at(step)[rank]) {
    return absl::DataLossError(
        absl::StrCat("step ", step, " rank ", rank, " restored other values"));
  }
  return absl::OkStatus();
}

std::vector<std::unique_ptr<Rank>> Connect(
    const std::vector<std::unique_ptr<testing::DaemonProcess>>& nodes) {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    ranks.push_back(std::make_unique<Rank>(nodes[r]->socket(), "tiers", r,
                                           kWorld, kGlobal));
  }
  return ranks;
}

std::string Logs(
    const std::vector<std::unique_ptr<testing::DaemonProcess>>& nodes) {
  std::string logs;
  for (auto& n : nodes) logs += n->log();
  return logs;
}

// Waits (up to 20 s) until `done` holds.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 400; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

TEST(IncrementalTiersTest, EveryTierRestoresIncrementsThroughFaultsAndResaves) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  testing::TempDir shared;
  const std::string t3 = shared.File("t3");
  const std::vector<std::string> keep = {
      "--keep-memory",  "8", "--keep-disk",   "8", "--shared-dir", t3,
      "--shared-every", "1", "--keep-shared", "8"};
  const std::vector<std::string> ids = {"node-a", "node-b", "node-c"};
  std::vector<std::unique_ptr<testing::DaemonProcess>> nodes;
  for (const std::string& id : ids) {
    nodes.push_back(
        std::make_unique<testing::DaemonProcess>(NodeArgs(etcd, id, keep)));
    ASSERT_TRUE(nodes.back()->Start()) << nodes.back()->log();
  }
  Saved saved;
  std::vector<std::unique_ptr<Rank>> ranks = Connect(nodes);
  for (auto& r : ranks) {
    ASSERT_TRUE(r->ckpt);
    r->Fill(1);
  }
  // Steps 1 to 3: a full save, then two increments with XOR deltas.
  for (uint64_t step = 1; step <= 3; ++step) {
    for (auto& r : ranks) {
      if (step > 1) Train(*r, step);
    }
    absl::Status s = SaveEverywhere(ranks, step, &saved);
    ASSERT_TRUE(s.ok()) << s << Logs(nodes);
  }
  std::string logs = Logs(nodes);
  for (uint32_t r = 0; r < kWorld; ++r) {
    EXPECT_THAT(logs, ContainsRegex(absl::StrCat(
                          "job tiers step 3 rank ", r,
                          ": persisted .*[1-9][0-9]* as XOR deltas")));
    EXPECT_THAT(logs,
                ContainsRegex(absl::StrCat(
                    "holding a replica of job tiers step 3 rank ", r,
                    " for node node-[abc] \\([0-9]+ bytes, an increment")));
    // The shared tier's copy of step 3 is an increment over its step 2.
    EXPECT_TRUE(std::filesystem::exists(
        absl::StrCat(t3, "/tiers/00000000000000000002-000000000", r,
                     ".ckpt.base-of-00000000000000000003")))
        << "rank " << r;
  }

  // Ranks 0 and 1 save steps 4 and 5, each an increment over the one
  // before, and their copies reach the peers and the shared tier; node c is
  // SIGKILLed before its rank saves either, so neither step commits.
  for (uint64_t step : {4u, 5u}) {
    for (uint32_t r : {0u, 1u}) {
      Train(*ranks[r], step);
      auto save = ranks[r]->ckpt->SaveAsync(step);
      ASSERT_TRUE(save.ok()) << save.status();
      ASSERT_TRUE((*save)->WaitStaged().ok());
    }
  }
  ASSERT_TRUE(Eventually([&] {
    const std::string l = Logs(nodes);
    return l.find("holding a replica of job tiers step 5 rank 0") !=
               std::string::npos &&
           l.find("holding a replica of job tiers step 5 rank 1") !=
               std::string::npos &&
           std::filesystem::exists(
               t3 + "/tiers/00000000000000000005-0000000000.ckpt") &&
           std::filesystem::exists(
               t3 + "/tiers/00000000000000000005-0000000001.ckpt");
  })) << Logs(nodes);
  ranks.clear();
  nodes[2]->Kill();
  ASSERT_TRUE(nodes[2]->Start()) << nodes[2]->log();

  // The job resumes from step 3, its last committed step, on every rank
  // (rank 2 from its restarted node's own tiers), and saves steps 4 and 5
  // again with other values: the votes and copies of the first ones are
  // replaced.
  ranks = Connect(nodes);
  for (auto& r : ranks) {
    ASSERT_TRUE(r->ckpt);
    absl::Status restored = r->ckpt->Restore(3);
    ASSERT_TRUE(restored.ok()) << restored << Logs(nodes);
    ASSERT_TRUE(r->w == saved.w[3][r->rank]) << "rank " << r->rank;
  }
  for (uint64_t step : {4u, 5u}) {
    for (auto& r : ranks) Train(*r, step, 3e-4f);
    absl::Status s = SaveEverywhere(ranks, step, &saved);
    ASSERT_TRUE(s.ok()) << s << Logs(nodes);
  }
  ranks.clear();
  // The first steps 4 and 5 were held by the peers: the new ones replaced
  // them (a copy as large as the one held is not the same save).
  logs = Logs(nodes);
  for (uint32_t r : {0u, 1u}) {
    EXPECT_THAT(logs, HasSubstr(absl::StrCat(
                          "job tiers step 4 rank ", r,
                          ": replaced by a new save of the same step")));
    for (uint64_t step : {4u, 5u}) {
      EXPECT_THAT(logs, ::testing::Not(HasSubstr(
                            absl::StrCat("job tiers step ", step, " rank ", r,
                                         ": node node-b still holds"))));
      EXPECT_THAT(logs, ::testing::Not(HasSubstr(
                            absl::StrCat("job tiers step ", step, " rank ", r,
                                         ": node node-c still holds"))));
    }
  }

  // Every committed step, every rank, on its own node (memory and disk).
  for (uint64_t step = 1; step <= 5; ++step) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      absl::Status s = RestoredAsSaved(nodes[r]->socket(), r, step, saved);
      EXPECT_TRUE(s.ok()) << s << nodes[r]->log();
    }
  }
  // Node a is lost with its directories: rank 0 restores from the peers.
  nodes[0]->Lose();
  for (uint64_t step = 1; step <= 5; ++step) {
    for (size_t n : {1u, 2u}) {
      absl::Status s = RestoredAsSaved(nodes[n]->socket(), 0, step, saved);
      EXPECT_TRUE(s.ok()) << s << " on " << ids[n] << "\n" << nodes[n]->log();
    }
  }
  // The shared tier alone: a node with no peer tier, on a cluster whose
  // other nodes are gone, restores every rank of every committed step.
  nodes[1]->Lose();
  nodes[2]->Lose();
  std::vector<std::string> alone = etcd.DaemonArgs();
  alone.insert(alone.end(),
               {"--lease-ttl", "2", "--node-id", "node-d", "--shared-dir", t3});
  testing::DaemonProcess d(alone);
  ASSERT_TRUE(d.Start()) << d.log();
  for (uint64_t step = 1; step <= 5; ++step) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      absl::Status s = RestoredAsSaved(d.socket(), r, step, saved);
      EXPECT_TRUE(s.ok()) << s << " from the shared tier\n" << d.log();
    }
  }
  Result verify = RunCli("--data-dir " + d.data_dir() + " verify tiers");
  EXPECT_EQ(verify.exit_code, 0) << verify.out;
  EXPECT_THAT(verify.out, HasSubstr("15 shard copies"));
}

}  // namespace
}  // namespace ckpt::client
