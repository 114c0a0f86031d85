#include "daemon/service/checkpoint_service.h"

#include <cerrno>
#include <filesystem>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection_fs.h"
#include "tests/daemon/service_util.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;
using testing::RankState;

constexpr proto::Tier kMem = proto::TIER_MEMORY;
constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;

using CheckpointServiceTest = testing::ServiceTest;

TEST_F(CheckpointServiceTest, StagedShardsPersistAndCommitAtEveryTier) {
  auto service = Start(io::DefaultFileSystem(), Options());
  for (uint32_t rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(
        RankState(1, rank).Stage(service.get(), "job", 1, rank, 3).ok());
  }
  auto mem = service->WaitCommitted("job", 1, kMem, absl::Seconds(30));
  ASSERT_TRUE(mem.ok()) << mem.status();
  auto disk = service->WaitCommitted("job", 1, kDisk, absl::Seconds(30));
  ASSERT_TRUE(disk.ok()) << disk.status();
  EXPECT_EQ(disk->world_size(), 3u);
  EXPECT_EQ(*service->LatestCommitted("job", kDisk).value(), 1u);
  for (uint32_t rank = 0; rank < 3; ++rank) {
    auto shard = service->GetShard("job", 1, rank);
    ASSERT_TRUE(shard.ok());
    EXPECT_EQ(shard->state(), proto::SHARD_PERSISTED);
    EXPECT_LT(shard->stored_bytes(), shard->raw_bytes())
        << "compressible weights";
    EXPECT_TRUE(RankState(1, rank).Check(shard->shard_path()).ok());
  }
}

TEST_F(CheckpointServiceTest, AStepMissingARankIsNeverCommitted) {
  auto service = Start(io::DefaultFileSystem(), Options());
  ASSERT_TRUE(RankState(1, 0).Stage(service.get(), "job", 1, 0, 2).ok());
  service->WaitIdle();
  auto r = service->WaitCommitted("job", 1, kDisk, absl::Milliseconds(200));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(service->LatestCommitted("job", kMem)->has_value());
}

// A saver that waits for a step retention has dropped since (it saves every
// step and waits later) is told so at once, not left waiting.
TEST_F(CheckpointServiceTest, AWaitForAStepRetentionDroppedEndsAtOnce) {
  ServiceOptions options = Options();
  options.keep_disk_steps = 1;
  options.keep_memory_steps = 1;
  auto service = Start(io::DefaultFileSystem(), options);
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(
        RankState(step, 0).Stage(service.get(), "job", step, 0, 1).ok());
    ASSERT_TRUE(
        service->WaitCommitted("job", step, kDisk, absl::Seconds(30)).ok());
  }
  service->WaitIdle();
  const absl::Time start = absl::Now();
  auto dropped = service->WaitCommitted("job", 1, kDisk, absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_EQ(dropped.status().code(), absl::StatusCode::kNotFound)
      << dropped.status();
  EXPECT_THAT(dropped.status().message(), HasSubstr("retention dropped it"));
  EXPECT_TRUE(service->WaitCommitted("job", 3, kDisk, absl::Seconds(30)).ok());
}

TEST_F(CheckpointServiceTest, AnUncommittedStepIsReplacedByANewSaveOfIt) {
  // Rank 0 saved step 2, then the job died before rank 1 did; the restarted
  // job saves step 2 again, and this time its state differs.
  auto service = Start(io::DefaultFileSystem(), Options());
  ASSERT_TRUE(RankState(2, 0).Stage(service.get(), "job", 2, 0, 2).ok());
  service->WaitIdle();
  ASSERT_EQ(service->GetShard("job", 2, 0)->state(), proto::SHARD_PERSISTED);
  const RankState again(102, 0);
  absl::Status resaved = again.Stage(service.get(), "job", 2, 0, 2);
  ASSERT_TRUE(resaved.ok()) << resaved;
  ASSERT_TRUE(RankState(2, 1).Stage(service.get(), "job", 2, 1, 2).ok());
  ASSERT_TRUE(service->WaitCommitted("job", 2, kDisk, absl::Seconds(30)).ok());
  auto shard = service->GetShard("job", 2, 0);
  ASSERT_TRUE(shard.ok());
  EXPECT_TRUE(again.Check(shard->shard_path()).ok()) << "the new save won";
  // A re-save racing its own persist: replaced as soon as that persist ends.
  ASSERT_TRUE(RankState(3, 0).Stage(service.get(), "job", 3, 0, 2).ok());
  ASSERT_TRUE(RankState(103, 0).Stage(service.get(), "job", 3, 0, 2).ok());
  ASSERT_TRUE(RankState(3, 1).Stage(service.get(), "job", 3, 1, 2).ok());
  ASSERT_TRUE(service->WaitCommitted("job", 3, kDisk, absl::Seconds(30)).ok());
  EXPECT_TRUE(RankState(103, 0)
                  .Check(service->GetShard("job", 3, 0)->shard_path())
                  .ok());

  // A committed step is never replaced, and what was committed stays intact.
  absl::Status refused = RankState(99, 1).Stage(service.get(), "job", 2, 1, 2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("step 2 is already committed at"));
  EXPECT_TRUE(
      RankState(2, 1).Check(service->GetShard("job", 2, 1)->shard_path()).ok());
  service->WaitIdle();
  EXPECT_EQ(service->arena()->used_bytes(), 2 * RankState(1, 0).bytes())
      << "replaced slots went back to the budget; step 3 is kept in memory";
}

TEST_F(CheckpointServiceTest, PersistFailureIsReportedAndTheNextSaveSucceeds) {
  io::FaultInjectionFs fs(io::DefaultFileSystem());
  auto service = Start(&fs, Options());
  ASSERT_TRUE(RankState(1, 0).Stage(service.get(), "job", 1, 0, 1).ok());
  ASSERT_TRUE(service->WaitCommitted("job", 1, kDisk, absl::Seconds(30)).ok());
  fs.FailWriteAt(fs.writes() + 2, ENOSPC);
  ASSERT_TRUE(RankState(2, 0).Stage(service.get(), "job", 2, 0, 1).ok());
  auto failed = service->WaitCommitted("job", 2, kDisk, absl::Seconds(30));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(failed.status().message(),
              HasSubstr("job job step 2 rank 0 failed to persist"));
  EXPECT_THAT(failed.status().message(), HasSubstr("No space left on device"));
  // Still committed in memory; the previous disk commit is intact; the next
  // save works.
  EXPECT_TRUE(service->WaitCommitted("job", 2, kMem, absl::Seconds(1)).ok());
  EXPECT_EQ(*service->LatestCommitted("job", kDisk).value(), 1u);
  EXPECT_TRUE(RankState(1, 0).Check(service->ShardPath("job", 1, 0)).ok());
  ASSERT_TRUE(RankState(3, 0).Stage(service.get(), "job", 3, 0, 1).ok());
  ASSERT_TRUE(service->WaitCommitted("job", 3, kDisk, absl::Seconds(30)).ok());
  EXPECT_TRUE(RankState(3, 0).Check(service->ShardPath("job", 3, 0)).ok());
}

// --persist-newest on a disk slower than the saves: step 1 is being
// persisted when steps 2, 3 and 4 come; 2 and 3 give way to 4. They stay
// committed in memory, a wait for their disk commit fails at once, and their
// memory copies go like persisted ones' once step 4 is committed.
TEST_F(CheckpointServiceTest, PersistNewestSkipsSavesTheDiskCannotTakeInTime) {
  io::FaultInjectionFs fs(io::DefaultFileSystem());
  fs.SetWriteThroughput(100 << 10);  // two seconds per shard
  ServiceOptions options = Options();
  options.persist_newest = true;
  auto service = Start(&fs, options);
  for (uint64_t step = 1; step <= 4; ++step) {
    ASSERT_TRUE(
        RankState(step, 0).Stage(service.get(), "job", step, 0, 1).ok());
  }
  const absl::Time start = absl::Now();
  auto skipped = service->WaitCommitted("job", 2, kDisk, absl::Seconds(60));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "no wait for it";
  ASSERT_EQ(skipped.status().code(), absl::StatusCode::kFailedPrecondition)
      << skipped.status();
  EXPECT_THAT(skipped.status().message(),
              HasSubstr("job job step 2 rank 0 will not reach tier "
                        "local_disk: a newer save of its rank came before "
                        "the disk took it"));
  EXPECT_TRUE(service->WaitCommitted("job", 3, kMem, absl::Seconds(1)).ok());
  ASSERT_TRUE(service->WaitCommitted("job", 4, kDisk, absl::Seconds(60)).ok());
  EXPECT_TRUE(RankState(4, 0).Check(service->ShardPath("job", 4, 0)).ok());
  service->WaitIdle();
  EXPECT_THAT(service->metrics()->Render(),
              HasSubstr("ckpt_persists_skipped_total{job=\"job\"} 2"));
  EXPECT_FALSE(std::filesystem::exists(service->ShardPath("job", 2, 0)));
  EXPECT_FALSE(std::filesystem::exists(service->ShardPath("job", 3, 0)));
  EXPECT_EQ(service->arena()->used_bytes(), RankState(4, 0).bytes())
      << "only step 4 is left in memory";
  EXPECT_EQ(*service->LatestCommitted("job", kDisk).value(), 4u);
}

TEST_F(CheckpointServiceTest, RefusesBadSlotDescriptions) {
  auto service = Start(io::DefaultFileSystem(), Options());
  RankState state(1, 0);
  auto slot = service->BeginStage("job", 1, 0, 1, state.bytes());
  ASSERT_TRUE(slot.ok());
  auto items = state.Items(0, 1);
  auto outside = items;
  outside[1].set_slot_offset(state.bytes());
  EXPECT_THAT(service->StageComplete("job", 1, 0, outside).message(),
              HasSubstr("does not fit"));
  auto overlap = items;
  overlap[1].set_slot_offset(8);
  EXPECT_THAT(service->StageComplete("job", 1, 0, overlap).message(),
              HasSubstr("overlap"));
  auto dotdot = items;
  dotdot[0].mutable_item()->set_name("../../etc/passwd");
  EXPECT_THAT(service->StageComplete("job", 1, 0, dotdot).message(),
              HasSubstr("'..'"));
  auto lying = items;
  lying[0].mutable_item()->set_raw_size(8);
  EXPECT_THAT(service->StageComplete("job", 1, 0, lying).message(),
              HasSubstr("box needs"));
  EXPECT_EQ(service->StageComplete("job", 2, 0, items).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(service->BeginStage("../x", 1, 0, 1, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service->BeginStage("job", 1, 5, 2, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing bad got in; the good description still works.
  ASSERT_TRUE(service->StageComplete("job", 1, 0, items).ok());
  EXPECT_TRUE(service->WaitCommitted("job", 1, kDisk, absl::Seconds(30)).ok());
}

TEST_F(CheckpointServiceTest, MemoryBudgetExhaustedSkipsAndSaysSo) {
  ServiceOptions o = Options();
  o.staging.budget_bytes = RankState(1, 0).bytes() + 100;
  // Persisting fails, so step 1's slot stays the only copy and keeps its
  // memory.
  io::FaultInjectionFs dead(io::DefaultFileSystem());
  dead.PowerLossAfter(0);
  auto service = Start(&dead, o);
  ASSERT_TRUE(RankState(1, 0).Stage(service.get(), "job", 1, 0, 1).ok());
  service->WaitIdle();
  auto refused = service->BeginStage("job", 2, 0, 1, RankState(2, 0).bytes());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("memory budget exhausted"));
  EXPECT_THAT(refused.status().message(), HasSubstr("policy: skip"));
  // The daemon is still up and still holds step 1 in memory.
  EXPECT_TRUE(service->WaitCommitted("job", 1, kMem, absl::Seconds(1)).ok());
  EXPECT_TRUE(service->arena()->Find({"job", 1, 0}).ok());
}

// A rank's staging that its trainer never completed (it died, or gave up on
// the call) is dropped, and its slot freed, once the rank completes a newer
// one; other ranks' stagings stay.
TEST_F(CheckpointServiceTest,
       AnAbandonedStagingIsDroppedOnceTheRankStagesANewerStep) {
  auto service = Start(io::DefaultFileSystem(), Options());
  auto abandoned = service->BeginStage("job", 1, 0, 2, RankState(1, 0).bytes());
  ASSERT_TRUE(abandoned.ok()) << abandoned.status();
  auto other = service->BeginStage("job", 1, 1, 2, RankState(1, 1).bytes());
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(RankState(2, 0).Stage(service.get(), "job", 2, 0, 2).ok());
  EXPECT_EQ(service->arena()->Find({"job", 1, 0}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(abandoned->path));
  auto gone = service->GetShard("job", 1, 0);
  EXPECT_FALSE(gone.ok() && gone->state() == proto::SHARD_STAGING);
  // Rank 1's staging of step 1 is its own business.
  EXPECT_TRUE(service->arena()->Find({"job", 1, 1}).ok());
}

TEST_F(CheckpointServiceTest, RetentionKeepsTheNewestStepsPerTier) {
  ServiceOptions o = Options();
  o.keep_disk_steps = 2;
  o.keep_memory_steps = 1;
  auto service = Start(io::DefaultFileSystem(), o);
  for (uint64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(
        RankState(step, 0).Stage(service.get(), "job", step, 0, 1).ok());
    ASSERT_TRUE(
        service->WaitCommitted("job", step, kDisk, absl::Seconds(30)).ok());
    service->WaitIdle();
  }
  for (uint64_t step = 1; step <= 5; ++step) {
    bool on_disk =
        *io::DefaultFileSystem()->Exists(service->ShardPath("job", step, 0));
    EXPECT_EQ(on_disk, step >= 4) << "step " << step;
    EXPECT_EQ(service->arena()->Find({"job", step, 0}).ok(), step == 5)
        << "step " << step;
    EXPECT_EQ(
        service->coordinator()->GetCommit("job", step, kDisk)->has_value(),
        step >= 4);
  }
  EXPECT_EQ(*service->LatestCommitted("job", kDisk).value(), 5u);
  EXPECT_TRUE(RankState(4, 0).Check(service->ShardPath("job", 4, 0)).ok());
}

// Shard files retired by retention are written over by the next persists:
// the same inode comes back under a new step's name, and every step still
// reads back exactly as saved (no byte of the old contents survives in it).
TEST_F(CheckpointServiceTest, RetiredShardFilesAreWrittenOverByLaterSteps) {
  ServiceOptions o = Options();
  o.keep_disk_steps = 1;
  o.recycle_files = 1;
  auto service = Start(io::DefaultFileSystem(), o);
  std::set<uint64_t> inodes;
  for (uint64_t step = 1; step <= 6; ++step) {
    ASSERT_TRUE(
        RankState(step, 0).Stage(service.get(), "job", step, 0, 1).ok());
    ASSERT_TRUE(
        service->WaitCommitted("job", step, kDisk, absl::Seconds(30)).ok());
    service->WaitIdle();
    const std::string path = service->ShardPath("job", step, 0);
    EXPECT_TRUE(RankState(step, 0).Check(path).ok()) << "step " << step;
    inodes.insert(io::DefaultFileSystem()->GetFileId(path)->inode);
  }
  // One file kept at a time, taken by the next persist: two inodes alternate
  // (the step kept on disk, the file kept for the next step), where there
  // would be six new files.
  EXPECT_EQ(inodes.size(), 2u);
  auto kept = io::DefaultFileSystem()->ListDir(o.data_dir + "/recycle");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->size(), 1u);

  // Turned off, retired files are deleted.
  service.reset();
  o.recycle_files = 0;
  service = Start(io::DefaultFileSystem(), o);
  kept = io::DefaultFileSystem()->ListDir(o.data_dir + "/recycle");
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->empty()) << "a kept file over the limit was deleted";
  ASSERT_TRUE(RankState(7, 0).Stage(service.get(), "job", 7, 0, 1).ok());
  ASSERT_TRUE(service->WaitCommitted("job", 7, kDisk, absl::Seconds(30)).ok());
  service->WaitIdle();
  EXPECT_FALSE(
      *io::DefaultFileSystem()->Exists(service->ShardPath("job", 6, 0)));
  kept = io::DefaultFileSystem()->ListDir(o.data_dir + "/recycle");
  EXPECT_TRUE(kept->empty());
}

// A daemon killed after the catalog forgot a step's last shard but before the
// step's commit records went (ckpt-chaos found such records piling up): the
// next garbage collection forgets them.
TEST_F(CheckpointServiceTest, CommitRecordsOfAStepWithNoShardLeftAreForgotten) {
  ServiceOptions o = Options();
  o.keep_disk_steps = 2;
  o.keep_memory_steps = 1;
  auto service = Start(io::DefaultFileSystem(), o);
  for (uint64_t step = 1; step <= 4; ++step) {
    ASSERT_TRUE(
        RankState(step, 0).Stage(service.get(), "job", step, 0, 1).ok());
    ASSERT_TRUE(
        service->WaitCommitted("job", step, kDisk, absl::Seconds(30)).ok());
    service->WaitIdle();
  }
  // The crash window, reproduced: step 3's shard is forgotten by the catalog
  // while its commit records stay.
  ASSERT_TRUE(service->catalog()->DeleteShard("job", 3, 0).ok());
  ASSERT_TRUE(service->coordinator()->GetCommit("job", 3, kDisk)->has_value());
  ASSERT_TRUE(RankState(5, 0).Stage(service.get(), "job", 5, 0, 1).ok());
  ASSERT_TRUE(service->WaitCommitted("job", 5, kDisk, absl::Seconds(30)).ok());
  service->WaitIdle();
  ASSERT_TRUE(service->CollectGarbage("job", {2, 1}).ok());
  EXPECT_FALSE(service->coordinator()->GetCommit("job", 3, kDisk)->has_value());
  EXPECT_FALSE(service->coordinator()->GetCommit("job", 3, kMem)->has_value());
  // What is kept is untouched.
  EXPECT_TRUE(service->coordinator()->GetCommit("job", 4, kDisk)->has_value());
  EXPECT_TRUE(service->coordinator()->GetCommit("job", 5, kDisk)->has_value());
}

TEST_F(CheckpointServiceTest, RestartAdoptsStagedSlotsAndDropsIncompleteOnes) {
  ServiceOptions o = Options();
  {
    // A service whose persist can never succeed stands in for one killed before
    // persisting.
    io::FaultInjectionFs dead(io::DefaultFileSystem());
    dead.PowerLossAfter(0);
    auto service = Start(&dead, o);
    ASSERT_TRUE(RankState(1, 0).Stage(service.get(), "job", 1, 0, 1).ok());
    ASSERT_TRUE(
        service->BeginStage("job", 2, 0, 1, 100).ok());  // never completed
    service->WaitIdle();
    // Its failure is recorded; a restart does not retry a FAILED shard, so mark
    // it staged again the way a killed daemon would have left it.
    auto record = service->GetShard("job", 1, 0);
    ASSERT_TRUE(record.ok());
    ASSERT_EQ(record->state(), proto::SHARD_FAILED);
    record->set_state(proto::SHARD_STAGED);
    record->clear_error();
    ASSERT_TRUE(service->catalog()->PutShard(*record).ok());
  }
  auto service = Start(io::DefaultFileSystem(), o);
  ASSERT_TRUE(service->WaitCommitted("job", 1, kDisk, absl::Seconds(30)).ok());
  EXPECT_TRUE(RankState(1, 0).Check(service->ShardPath("job", 1, 0)).ok());
  EXPECT_EQ(service->GetShard("job", 2, 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(service->arena()->Find({"job", 2, 0}).ok());
}

}  // namespace
}  // namespace ckpt::daemon

namespace ckpt::daemon {
namespace {

// A committed step whose shard this node is staging again (a re-save that
// began before the step committed elsewhere, see Supersede) restores from
// the committed copy the shared tier holds, not from the slot being filled.
TEST_F(CheckpointServiceTest, AShardBeingStagedAgainRestoresFromTheSharedTier) {
  ServiceOptions o = Options();
  o.shared.dir = dir_.File("shared");
  auto service = Start(io::DefaultFileSystem(), o);
  ASSERT_TRUE(RankState(1, 0).Stage(service.get(), "job", 1, 0, 1).ok());
  ASSERT_TRUE(
      service->WaitCommitted("job", 1, proto::TIER_SHARED, absl::Seconds(30))
          .ok());
  service->WaitIdle();
  auto here = service->GetShard("job", 1, 0);
  ASSERT_TRUE(here.ok()) << here.status();
  proto::ShardRecord again = *here;
  again.set_state(proto::SHARD_STAGING);
  again.clear_shard_path();
  ASSERT_TRUE(service->catalog()->PutShard(again).ok());
  auto found = service->GetShard("job", 1, 0);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->state(), proto::SHARD_PERSISTED);
  EXPECT_THAT(found->shard_path(), HasSubstr(dir_.File("shared")));
  EXPECT_TRUE(RankState(1, 0).Check(found->shard_path()).ok());
}

}  // namespace
}  // namespace ckpt::daemon
