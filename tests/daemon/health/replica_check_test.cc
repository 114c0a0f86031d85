// Replicas compared: digests from a staged shard's hashes and from a
// manifest agree, a box saved by several ranks is compared and one saved
// once is not, the minority is named when there is a majority and every
// replica when there is none; the coordinator keeps the first verdict and
// LatestTrusted skips a suspect step.
#include "daemon/health/replica_check.h"

#include "daemon/catalog/kv_store.h"
#include "daemon/coord/embedded_coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint32_t kChunk = 1024;

proto::StagedItem Tensor(const std::string& name, int64_t offset,
                         int64_t length, std::vector<uint64_t> hashes) {
  proto::StagedItem s;
  proto::Item& item = *s.mutable_item();
  item.set_name(name);
  item.set_kind(proto::ITEM_KIND_TENSOR);
  item.set_dtype(proto::DTYPE_FLOAT32);
  item.add_global_shape(1024);
  item.add_box_offset(offset);
  item.add_box_length(length);
  item.set_raw_size(length * 4);
  for (uint64_t h : hashes) s.add_chunk_xxh3(h);
  s.set_chunk_size(kChunk);
  return s;
}

// Rank `rank` of 4 saves the replicated "w" (whole, its chunks hashed as
// `w`) and its quarter of "s", and a byte item.
proto::ShardRecord Shard(uint32_t rank, std::vector<uint64_t> w) {
  proto::ShardRecord r;
  r.set_job("j");
  r.set_step(7);
  r.set_rank(rank);
  r.set_world_size(4);
  *r.add_items() = Tensor("w", 0, 1024, std::move(w));
  *r.add_items() = Tensor("s", 256 * rank, 256, {rank + 100u});
  proto::StagedItem rng;
  rng.mutable_item()->set_name("rng");
  rng.mutable_item()->set_kind(proto::ITEM_KIND_BYTES);
  rng.mutable_item()->set_raw_size(8);
  *r.add_items() = rng;
  return r;
}

std::vector<proto::ReplicaDigests> Digests(
    const std::vector<std::vector<uint64_t>>& w_of_rank) {
  std::vector<proto::ReplicaDigests> out;
  for (uint32_t rank = 0; rank < w_of_rank.size(); ++rank) {
    auto d = DigestsOfStaged(Shard(rank, w_of_rank[rank]),
                             "node-" + std::to_string(rank / 2));
    EXPECT_TRUE(d.has_value());
    out.push_back(*d);
  }
  return out;
}

const std::vector<uint64_t> kGood = {1, 2, 3, 4};
const std::vector<uint64_t> kFlipped = {1, 2, 9, 4};

TEST(ReplicaCheckTest, AgreeingReplicasAreClean) {
  proto::ReplicaCheck c =
      CompareReplicas("j", 7, Digests({kGood, kGood, kGood, kGood}));
  EXPECT_FALSE(c.suspect());
  EXPECT_EQ(c.replicated_boxes(), 1u) << "\"s\" is saved once per box";
  EXPECT_THAT(c.mismatches(), IsEmpty());
}

TEST(ReplicaCheckTest, TheMinorityIsNamedWithItsNode) {
  proto::ReplicaCheck c =
      CompareReplicas("j", 7, Digests({kGood, kGood, kFlipped, kGood}));
  ASSERT_TRUE(c.suspect());
  ASSERT_EQ(c.mismatches_size(), 1);
  const proto::ReplicaMismatch& m = c.mismatches(0);
  EXPECT_EQ(m.item(), "w");
  EXPECT_THAT(m.majority_ranks(), ElementsAre(0, 1, 3));
  EXPECT_THAT(m.minority_ranks(), ElementsAre(2));
  EXPECT_THAT(m.minority_nodes(), ElementsAre("node-1"));
  EXPECT_EQ(
      DescribeMismatches(c),
      "item \"w\": rank 2 (node node-1) outside the majority (ranks 0, 1, "
      "3)");
}

TEST(ReplicaCheckTest, WithoutAMajorityEveryReplicaIsNamed) {
  proto::ReplicaCheck two = CompareReplicas("j", 7, Digests({kGood, kFlipped}));
  ASSERT_TRUE(two.suspect());
  EXPECT_THAT(two.mismatches(0).majority_ranks(), IsEmpty());
  EXPECT_THAT(two.mismatches(0).minority_ranks(),
              ::testing::UnorderedElementsAre(0, 1));
  EXPECT_THAT(DescribeMismatches(two), HasSubstr("with no majority"));
  // Two against two: a tie is no majority either.
  proto::ReplicaCheck tie =
      CompareReplicas("j", 7, Digests({kGood, kFlipped, kGood, kFlipped}));
  EXPECT_THAT(tie.mismatches(0).majority_ranks(), IsEmpty());
  EXPECT_EQ(tie.mismatches(0).minority_ranks_size(), 4);
}

TEST(ReplicaCheckTest, RankLocalTensorsAreNotCompared) {
  std::vector<proto::ReplicaDigests> ranks;
  proto::ShardManifest manifest;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    proto::ShardRecord shard = Shard(rank, rank == 0 ? kGood : kFlipped);
    shard.mutable_items(0)->set_rank_local(true);
    auto d = DigestsOfStaged(shard, "n");
    ASSERT_TRUE(d.has_value());
    ranks.push_back(*d);
  }
  EXPECT_FALSE(CompareReplicas("j", 7, ranks).suspect());
  // From a manifest: the shard record names them.
  *manifest.add_items() = Shard(0, kGood).items(0).item();
  manifest.mutable_items(0)->add_chunks()->set_raw_xxh3(1);
  EXPECT_EQ(DigestsOfManifest(manifest, "n").boxes_size(), 1);
  EXPECT_EQ(DigestsOfManifest(manifest, "n", {"w"}).boxes_size(), 0);
}

TEST(ReplicaCheckTest, AManifestGivesTheDigestsTheStagedHashesGive) {
  const proto::ShardRecord staged = Shard(1, kGood);
  proto::ShardManifest manifest;
  manifest.set_job("j");
  manifest.set_step(7);
  manifest.set_rank(1);
  manifest.set_world_size(4);
  manifest.set_chunk_size(kChunk);
  for (const proto::StagedItem& s : staged.items()) {
    proto::Item& item = *manifest.add_items() = s.item();
    for (uint64_t h : s.chunk_xxh3()) item.add_chunks()->set_raw_xxh3(h);
  }
  auto from_slot = DigestsOfStaged(staged, "n");
  ASSERT_TRUE(from_slot.has_value());
  const proto::ReplicaDigests from_file = DigestsOfManifest(manifest, "n");
  EXPECT_EQ(from_file.SerializeAsString(), from_slot->SerializeAsString());
  // A tensor its trainer did not hash: the persist gives them.
  proto::ShardRecord unhashed = staged;
  unhashed.mutable_items(0)->clear_chunk_xxh3();
  EXPECT_FALSE(DigestsOfStaged(unhashed, "n").has_value());
  // Another chunk size is another box: not compared with this one.
  manifest.set_chunk_size(kChunk * 2);
  EXPECT_NE(DigestsOfManifest(manifest, "n").boxes(0).box(),
            from_slot->boxes(0).box());
}

TEST(ReplicaCheckTest, TheCoordinatorKeepsTheFirstVerdictAndSkipsSuspects) {
  testing::TempDir dir;
  auto store = KvStore::Open(dir.File("db"));
  ASSERT_TRUE(store.ok()) << store.status();
  EmbeddedCoordinator coordinator(store->get());
  constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;
  for (uint64_t step : {5, 6, 7}) {
    ASSERT_TRUE(coordinator.Vote("j", step, 0, 1, {kDisk}).ok());
  }
  for (const proto::ReplicaDigests& d : Digests({kGood, kFlipped})) {
    ASSERT_TRUE(coordinator.PutReplicaDigests("j", 7, d).ok());
  }
  auto listed = coordinator.ListReplicaDigests("j", 7);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  proto::ReplicaCheck suspect = CompareReplicas("j", 7, *listed);
  suspect.set_checked_by("first");
  auto kept = coordinator.SettleReplicaCheck(suspect);
  ASSERT_TRUE(kept.ok()) << kept.status();
  proto::ReplicaCheck clean;
  clean.set_job("j");
  clean.set_step(7);
  clean.set_checked_by("second");
  kept = coordinator.SettleReplicaCheck(clean);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->checked_by(), "first") << "the first verdict stays";
  EXPECT_EQ(*coordinator.LatestCommitted("j", kDisk).value(), 7u);
  EXPECT_EQ(*coordinator.LatestTrusted("j", kDisk).value(), 6u);
  // Step 6 suspect too: 5.
  suspect.set_step(6);
  ASSERT_TRUE(coordinator.SettleReplicaCheck(suspect).ok());
  EXPECT_EQ(*coordinator.LatestTrusted("j", kDisk).value(), 5u);
  // Records go with their step.
  ASSERT_TRUE(coordinator.ForgetStep("j", 6).ok());
  EXPECT_FALSE(coordinator.GetReplicaCheck("j", 6)->has_value());
  EXPECT_TRUE(coordinator.GetReplicaCheck("j", 7)->has_value());
}

}  // namespace
}  // namespace ckpt::daemon
