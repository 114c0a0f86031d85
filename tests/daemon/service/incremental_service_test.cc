// ckptd's incremental saves: a rank's shard stores only the chunks that
// changed since its last save, a full save comes every --full-every saves,
// and garbage collection keeps the files kept shards store chunks in.
#include <cstdio>
#include <random>
#include <set>

#include "daemon/service/checkpoint_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/shard_reader.h"
#include "tests/daemon/service_util.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using testing::RankState;

constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;
constexpr uint32_t kChunk = 64 << 10;

class IncrementalServiceTest : public testing::ServiceTest {
 protected:
  ServiceOptions Options() {
    ServiceOptions o = ServiceTest::Options();
    o.writer.chunk_size = kChunk;
    o.keep_disk_steps = 1;
    o.full_every = 4;
    return o;
  }
};

// Fine-tuning: only the first chunk of the weights changes from step to step.
RankState StateAt(uint64_t step) {
  RankState state(1, 0, 4 * kChunk / 4);  // four chunks of weights
  state.weights[8] = static_cast<uint8_t>(step);
  state.rng[0] = static_cast<uint8_t>(step);
  return state;
}

bool OnDisk(CheckpointService* service, uint64_t step) {
  return *io::DefaultFileSystem()->Exists(service->ShardPath("job", step, 0));
}

TEST_F(IncrementalServiceTest, SavesStoreWhatChangedAndKeepTheirBases) {
  ServiceOptions o = Options();
  o.writer.xor_deltas = false;  // the changed chunk stored as it is
  auto started = CheckpointService::Start(io::DefaultFileSystem(), o);
  ASSERT_TRUE(started.ok()) << started.status();
  CheckpointService* service = started->get();
  for (uint64_t step = 1; step <= 9; ++step) {
    ASSERT_TRUE(StateAt(step).Stage(service, "job", step, 0, 1).ok());
    ASSERT_TRUE(
        service->WaitCommitted("job", step, kDisk, absl::Seconds(30)).ok());
    service->WaitIdle();
    absl::StatusOr<proto::ShardRecord> r = service->GetShard("job", step, 0);
    ASSERT_TRUE(r.ok()) << r.status();
    // Steps 1, 5 and 9 are full (every fourth save); the others store the
    // changed chunk and the byte item, and name the full save before them.
    const bool full = step % 4 == 1;
    const std::vector<uint64_t> bases(r->base_steps().begin(),
                                      r->base_steps().end());
    if (full) {
      EXPECT_TRUE(bases.empty()) << "step " << step;
      EXPECT_GT(r->stored_bytes(), 2 * kChunk) << "step " << step;
    } else {
      EXPECT_EQ(bases, std::vector<uint64_t>{(step - 1) / 4 * 4 + 1})
          << "step " << step;
      EXPECT_LT(r->stored_bytes(), 2 * kChunk) << "step " << step;
    }
    EXPECT_TRUE(StateAt(step).Check(r->shard_path()).ok()) << "step " << step;
    // --keep-disk 1 keeps the newest step, and the full save it builds on.
    for (uint64_t s = 1; s <= step; ++s) {
      const bool kept = s == step || (!full && s == (step - 1) / 4 * 4 + 1);
      EXPECT_EQ(OnDisk(service, s), kept) << "step " << s << " after " << step;
    }
  }
  // A restart forgets the last shard: the next save is full.
  started->reset();
  started = CheckpointService::Start(io::DefaultFileSystem(), o);
  ASSERT_TRUE(started.ok()) << started.status();
  service = started->get();
  ASSERT_TRUE(StateAt(10).Stage(service, "job", 10, 0, 1).ok());
  ASSERT_TRUE(service->WaitCommitted("job", 10, kDisk, absl::Seconds(30)).ok());
  service->WaitIdle();
  EXPECT_TRUE(service->GetShard("job", 10, 0)->base_steps().empty());
}

// With XOR deltas (the default): the changed float chunk is stored as the XOR
// with the save before, which its shard then names as a base too; retention
// keeps that chain, and every kept step reads back bit-exact.
TEST_F(IncrementalServiceTest, ChangedFloatChunksAreDeltasOfTheSaveBefore) {
  auto started = CheckpointService::Start(io::DefaultFileSystem(), Options());
  ASSERT_TRUE(started.ok()) << started.status();
  CheckpointService* service = started->get();
  for (uint64_t step = 1; step <= 6; ++step) {
    ASSERT_TRUE(StateAt(step).Stage(service, "job", step, 0, 1).ok());
    ASSERT_TRUE(
        service->WaitCommitted("job", step, kDisk, absl::Seconds(30)).ok());
    service->WaitIdle();
    absl::StatusOr<proto::ShardRecord> r = service->GetShard("job", step, 0);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::set<uint64_t> bases(r->base_steps().begin(),
                                   r->base_steps().end());
    const uint64_t full = (step - 1) / 4 * 4 + 1;  // steps 1 and 5 are full
    std::set<uint64_t> expected;
    if (step != full) expected = {full, step - 1};
    EXPECT_EQ(bases, expected) << "step " << step;
    auto reader =
        snapshot::ShardReader::Open(io::DefaultFileSystem(), r->shard_path());
    ASSERT_TRUE(reader.ok()) << reader.status();
    const proto::ChunkInfo& changed = (*reader)->manifest().items(0).chunks(0);
    EXPECT_EQ(changed.xor_base() > 0, step != full) << "step " << step;
    if (step != full) {
      // The XOR of two saves that differ in one byte: next to nothing.
      EXPECT_LT(changed.stored_size(), 1024u) << "step " << step;
    }
    // --keep-disk 1 keeps the newest step and the chain it reads through.
    for (uint64_t s = 1; s <= step; ++s) {
      const bool kept = s == step || (step != full && s >= full);
      EXPECT_EQ(OnDisk(service, s), kept) << "step " << s << " after " << step;
    }
    for (uint64_t s = full; s <= step; ++s)
      EXPECT_TRUE(StateAt(s).Check(service->ShardPath("job", s, 0)).ok())
          << "step " << s << " after " << step;
  }
}

// Saves back to back on two ranks while garbage collection runs beside the
// persists (two threads, --keep-disk 1): a collection must never drop a
// base a persist is building on, nor one a kept shard stores chunks in. Every
// shard file left verifies, bases included, and the last step reads back.
TEST_F(IncrementalServiceTest, CollectionsRacingSavesNeverLeaveADanglingBase) {
  ServiceOptions o = Options();
  o.full_every = 5;
  o.staging.budget_bytes = 256 << 20;
  auto started = CheckpointService::Start(io::DefaultFileSystem(), o);
  ASSERT_TRUE(started.ok()) << started.status();
  CheckpointService* service = started->get();
  std::mt19937_64 rng(testing::TestSeed());
  constexpr uint64_t kSteps = 60;
  std::vector<RankState> last;
  for (uint64_t step = 1; step <= kSteps; ++step) {
    last.clear();
    for (uint32_t rank = 0; rank < 2; ++rank) {
      RankState state(1, rank, 4 * kChunk / 4);
      // A random one of the four chunks changes, and the byte item.
      state.weights[(rng() % 4) * kChunk + rng() % kChunk] ^= 1 + step % 255;
      state.rng[0] = static_cast<uint8_t>(step);
      ASSERT_TRUE(state.Stage(service, "job", step, rank, 2).ok());
      last.push_back(std::move(state));
    }
  }
  ASSERT_TRUE(
      service->WaitCommitted("job", kSteps, kDisk, absl::Seconds(60)).ok());
  service->WaitIdle();
  auto shards = service->catalog()->ListShards("job");
  ASSERT_TRUE(shards.ok());
  int increments = 0;
  for (const proto::ShardRecord& r : *shards) {
    if (r.shard_path().empty()) continue;
    increments += r.base_steps_size() > 0;
    EXPECT_THAT(snapshot::VerifyShard(io::DefaultFileSystem(), r.shard_path()),
                ::testing::IsEmpty())
        << "step " << r.step() << " rank " << r.rank();
  }
  for (uint32_t rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(last[rank].Check(service->ShardPath("job", kSteps, rank)).ok());
  }
  std::printf("%d of the kept shards are increments\n", increments);
}

TEST_F(IncrementalServiceTest, FullEveryOneAndARollBackMakeFullSaves) {
  ServiceOptions o = Options();
  o.keep_disk_steps = 5;
  auto started = CheckpointService::Start(io::DefaultFileSystem(), o);
  ASSERT_TRUE(started.ok()) << started.status();
  CheckpointService* service = started->get();
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(StateAt(step).Stage(service, "job", step, 0, 1).ok());
    ASSERT_TRUE(
        service->WaitCommitted("job", step, kDisk, absl::Seconds(30)).ok());
  }
  service->WaitIdle();
  // Its unchanged chunks lie in step 1, its changed one is a delta of 2's.
  EXPECT_EQ(service->GetShard("job", 3, 0)->base_steps_size(), 2);
  // Back to step 2, newer steps kept in an archive job: step 3 is copied
  // there with the full save it stores chunks in, and reads alone.
  absl::StatusOr<proto::RollbackRecord> back =
      service->RollBack("job", 2, "", /*discard_newer=*/false);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_FALSE(back->archived_as().empty());
  absl::StatusOr<proto::ShardRecord> archived =
      service->GetShard(back->archived_as(), 3, 0);
  ASSERT_TRUE(archived.ok()) << archived.status();
  EXPECT_TRUE(StateAt(3).Check(archived->shard_path()).ok());
  // The next save of the job does not build on the dropped step 3.
  ASSERT_TRUE(StateAt(3).Stage(service, "job", 3, 0, 1).ok());
  ASSERT_TRUE(service->WaitCommitted("job", 3, kDisk, absl::Seconds(30)).ok());
  service->WaitIdle();
  EXPECT_TRUE(service->GetShard("job", 3, 0)->base_steps().empty());
  EXPECT_TRUE(StateAt(3).Check(service->ShardPath("job", 3, 0)).ok());
  started->reset();

  o.full_every = 1;
  o.data_dir = dir_.File("data1");
  started = CheckpointService::Start(io::DefaultFileSystem(), o);
  ASSERT_TRUE(started.ok()) << started.status();
  service = started->get();
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(StateAt(step).Stage(service, "job", step, 0, 1).ok());
    ASSERT_TRUE(
        service->WaitCommitted("job", step, kDisk, absl::Seconds(30)).ok());
    service->WaitIdle();
    EXPECT_TRUE(service->GetShard("job", step, 0)->base_steps().empty());
  }
}

}  // namespace
}  // namespace ckpt::daemon
