// Silent data corruption across replicas, end to end on two real ckptd on
// etcd: a rank whose replicated tensor was corrupted before its save (one
// value flipped: what a GPU computing wrong values leaves) makes the step
// suspect; the rank and its node are named; RestoreLatest resumes from the
// previous clean step; a restore of the suspect step asked for returns the
// majority's bytes with three replicas, and each rank's own with two.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/daemon/etcd_process.h"
#include "tests/tools/run_cli.h"

namespace ckpt::client {
namespace {

using ::testing::ElementsAre;

constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;
constexpr int64_t kReplicated = 1 << 16;  // floats every rank saves whole
constexpr int64_t kSharded = 3 << 14;     // floats split among the ranks

// A data-parallel rank: the replicated "model/w" (a DDP model), its share
// of "optim/s" (ZeRO-style), its RNG.
struct DpRank {
  uint32_t rank, world;
  std::vector<float> w = std::vector<float>(kReplicated);
  std::vector<float> s;
  std::string rng;
  std::unique_ptr<Checkpointer> ckpt;

  DpRank(const std::string& socket, const std::string& job, uint32_t rank,
         uint32_t world, bool read_only = false)
      : rank(rank), world(world), s(kSharded / world) {
    CheckpointerOptions o{job, rank, world, socket};
    o.read_only = read_only;
    auto c = Checkpointer::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return;
    ckpt = *std::move(c);
    EXPECT_TRUE(ckpt->RegisterTensor("model/w", proto::DTYPE_FLOAT32, w.data(),
                                     {kReplicated}, {0}, {kReplicated})
                    .ok());
    EXPECT_TRUE(ckpt->RegisterTensor("optim/s", proto::DTYPE_FLOAT32, s.data(),
                                     {kSharded}, {SOffset()},
                                     {kSharded / world})
                    .ok());
    EXPECT_TRUE(ckpt->RegisterBytes("rng", &rng).ok());
  }
  int64_t SOffset() const { return kSharded / world * rank; }
  void Fill(uint64_t step) {
    for (int64_t i = 0; i < kReplicated; ++i) w[i] = Value(step, i);
    for (size_t i = 0; i < s.size(); ++i)
      s[i] = Value(step + 1000, SOffset() + i);
    rng = absl::StrCat("rng-", step, "-", rank);
  }
  // One bit of one value of the replicated tensor flips.
  void Corrupt() {
    uint32_t bits;
    std::memcpy(&bits, &w[12345], sizeof bits);
    bits ^= 1u << 3;
    std::memcpy(&w[12345], &bits, sizeof bits);
  }
  bool WIs(uint64_t step) const {
    for (int64_t i = 0; i < kReplicated; ++i) {
      if (w[i] != Value(step, i)) return false;
    }
    return true;
  }
  bool SIs(uint64_t step) const {
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != Value(step + 1000, SOffset() + i)) return false;
    }
    return true;
  }
};

// Saves `step` on every rank (rank `corrupt` corrupted after filling) and
// waits for its commit on disk.
absl::Status SaveStep(std::vector<DpRank*> ranks, uint64_t step,
                      int corrupt = -1) {
  std::vector<std::shared_ptr<SaveHandle>> saves;
  for (DpRank* r : ranks) {
    r->Fill(step);
    if (static_cast<int>(r->rank) == corrupt) r->Corrupt();
    auto save = r->ckpt->SaveAsync(step);
    if (!save.ok()) return save.status();
    saves.push_back(*std::move(save));
  }
  for (auto& s : saves) {
    absl::Status st = s->WaitCommitted(kDisk, absl::Seconds(60));
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// The suspect steps once `step` is among them (the verdict follows the
// commit), or what there is after 30 s.
std::vector<proto::ReplicaCheck> SuspectsOnceThere(Checkpointer& c,
                                                   uint64_t step) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (;;) {
    auto suspects = c.SuspectSteps();
    EXPECT_TRUE(suspects.ok()) << suspects.status();
    if (!suspects.ok()) return {};
    for (const proto::ReplicaCheck& check : *suspects) {
      if (check.step() == step || absl::Now() > deadline) return *suspects;
    }
    if (absl::Now() > deadline) return *suspects;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// A counter's sum over both nodes' /metrics.
double Summed(const std::vector<const testing::DaemonProcess*>& nodes,
              const std::string& name,
              const std::map<std::string, std::string>& labels) {
  double sum = 0;
  for (const testing::DaemonProcess* d : nodes) {
    auto text = GetMetricsText(d->socket());
    EXPECT_TRUE(text.ok()) << text.status();
    if (!text.ok()) continue;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      if (!absl::StartsWith(line, name + "{")) continue;
      bool all = true;
      for (const auto& [k, v] : labels) {
        all = all && absl::StrContains(line, absl::StrCat(k, "=\"", v, "\""));
      }
      double value = 0;
      if (all && absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value))
        sum += value;
    }
  }
  return sum;
}

TEST(SdcTest, AFlippedReplicaIsNamedSkippedAndOutvoted) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  testing::DaemonProcess a(NodeArgs(etcd, "node-a")),
      b(NodeArgs(etcd, "node-b"));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  // Three replicas: ranks 0 and 1 on node a, rank 2 on node b.
  {
    DpRank r0(a.socket(), "dp3", 0, 3), r1(a.socket(), "dp3", 1, 3),
        r2(b.socket(), "dp3", 2, 3);
    ASSERT_TRUE(r0.ckpt && r1.ckpt && r2.ckpt);
    absl::Status s = SaveStep({&r0, &r1, &r2}, 1);
    ASSERT_TRUE(s.ok()) << s << a.log() << b.log();
    s = SaveStep({&r0, &r1, &r2}, 2, /*corrupt=*/2);
    ASSERT_TRUE(s.ok()) << s << a.log() << b.log();
    std::vector<proto::ReplicaCheck> suspects = SuspectsOnceThere(*r0.ckpt, 2);
    ASSERT_EQ(suspects.size(), 1u) << a.log() << b.log();
    ASSERT_EQ(suspects[0].mismatches_size(), 1);
    const proto::ReplicaMismatch& m = suspects[0].mismatches(0);
    EXPECT_EQ(m.item(), "model/w");
    EXPECT_THAT(m.majority_ranks(), ElementsAre(0, 1));
    EXPECT_THAT(m.minority_ranks(), ElementsAre(2));
    EXPECT_THAT(m.minority_nodes(), ElementsAre("node-b"));
    EXPECT_EQ(suspects[0].replicated_boxes(), 1u) << "optim/s is sharded";
  }
  EXPECT_EQ(Summed({&a, &b}, "ckpt_sdc_suspect_shards_total",
                   {{"job", "dp3"}, {"node", "node-b"}, {"rank", "2"}}),
            1);
  EXPECT_EQ(Summed({&a, &b}, "ckpt_sdc_suspect_steps_total", {{"job", "dp3"}}),
            1);
  EXPECT_EQ(Summed({&a, &b}, "ckpt_replica_checks_total",
                   {{"job", "dp3"}, {"verdict", "clean"}}),
            1)
      << "step 1";
  EXPECT_THAT(b.log() + a.log(),
              ::testing::HasSubstr("silent data corruption suspected"));
  // The operator's commands name them too.
  Result ls = RunCli("--data-dir " + b.data_dir() + " ls dp3 --json --socket " +
                     b.socket());
  ASSERT_EQ(ls.exit_code, 0) << ls.out;
  nlohmann::json j = nlohmann::json::parse(ls.out, nullptr, false);
  ASSERT_EQ(j["steps"].size(), 2u) << ls.out;
  EXPECT_FALSE(j["steps"][0].contains("suspect"));
  EXPECT_EQ(j["steps"][1]["suspect"]["mismatches"][0]["minority_nodes"][0],
            "node-b")
      << ls.out;
  const std::string named =
      "step 2 SUSPECT (replicas disagree, not resumed from): \"model/w\" on "
      "rank 2 (node node-b) outside the majority (ranks 0, 1)";
  for (const std::string command : {"status", "inspect dp3 2", "ls dp3"}) {
    Result r = RunCli("--data-dir " + b.data_dir() + " --socket " + b.socket() +
                      " " + command);
    EXPECT_EQ(r.exit_code, 0) << command << ": " << r.out;
    EXPECT_THAT(r.out, ::testing::HasSubstr(named)) << command;
  }
  // A trainer resuming gets the clean step 1.
  {
    DpRank r2(b.socket(), "dp3", 2, 3, /*read_only=*/true);
    auto latest = r2.ckpt->RestoreLatest(kDisk);
    ASSERT_TRUE(latest.ok()) << latest.status();
    ASSERT_TRUE(latest->has_value());
    EXPECT_EQ(**latest, 1u);
    EXPECT_TRUE(r2.WIs(1) && r2.SIs(1));
    // Asked for, step 2 restores with the majority's "model/w".
    absl::Status restored = r2.ckpt->Restore(2);
    ASSERT_TRUE(restored.ok()) << restored << b.log();
    EXPECT_TRUE(r2.WIs(2)) << "the majority's bytes, not rank 2's own";
    EXPECT_TRUE(r2.SIs(2));
    EXPECT_EQ(r2.rng, "rng-2-2");
  }
  // Two replicas: no majority; both named, each restores its own.
  {
    DpRank r0(a.socket(), "dp2", 0, 2), r1(b.socket(), "dp2", 1, 2);
    ASSERT_TRUE(r0.ckpt && r1.ckpt);
    ASSERT_TRUE(SaveStep({&r0, &r1}, 5).ok());
    ASSERT_TRUE(SaveStep({&r0, &r1}, 6, /*corrupt=*/1).ok());
    std::vector<proto::ReplicaCheck> suspects = SuspectsOnceThere(*r1.ckpt, 6);
    ASSERT_EQ(suspects.size(), 1u);
    const proto::ReplicaMismatch& m = suspects[0].mismatches(0);
    EXPECT_TRUE(m.majority_ranks().empty());
    EXPECT_THAT(m.minority_ranks(), ::testing::UnorderedElementsAre(0, 1));
    EXPECT_THAT(m.minority_nodes(),
                ::testing::UnorderedElementsAre("node-a", "node-b"));
    DpRank again(b.socket(), "dp2", 1, 2, /*read_only=*/true);
    auto latest = again.ckpt->RestoreLatest(kDisk);
    ASSERT_TRUE(latest.ok() && latest->has_value()) << latest.status();
    EXPECT_EQ(**latest, 5u);
    ASSERT_TRUE(again.ckpt->Restore(6).ok());
    EXPECT_FALSE(again.WIs(6)) << "its own bytes: no majority to prefer";
    EXPECT_TRUE(again.SIs(6));
  }
}

TEST(SdcTest, ARankLocalTensorIsNotCompared) {
  testing::DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  DpRank r0(d.socket(), "local", 0, 2), r1(d.socket(), "local", 1, 2);
  ASSERT_TRUE(r0.ckpt && r1.ckpt);
  // "model/w" of this job is each rank's own: rank 1's differs, by design.
  ASSERT_TRUE(r0.ckpt->MarkRankLocal("model/w").ok());
  ASSERT_TRUE(r1.ckpt->MarkRankLocal("model/w").ok());
  EXPECT_EQ(r0.ckpt->MarkRankLocal("rng").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r0.ckpt->MarkRankLocal("nope").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(SaveStep({&r0, &r1}, 1, /*corrupt=*/1).ok()) << d.log();
  // The step's check is made (clean), and nothing is suspect.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (Summed({&d}, "ckpt_replica_checks_total", {{"job", "local"}}) < 1 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(Summed({&d}, "ckpt_replica_checks_total",
                   {{"job", "local"}, {"verdict", "clean"}}),
            1);
  auto suspects = r0.ckpt->SuspectSteps();
  ASSERT_TRUE(suspects.ok()) << suspects.status();
  EXPECT_TRUE(suspects->empty());
  auto latest = r1.ckpt->LatestCommitted(kDisk);
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(**latest, 1u);
}

}  // namespace
}  // namespace ckpt::client
