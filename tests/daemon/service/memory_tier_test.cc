// The memory tier as a cache (CheckpointService, checkpoint_service_memory.cc):
// jobs run one after another on a small budget, copies that must stay, copies
// a reader holds, the idle-job TTL and the operator's drop.
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "daemon/service/checkpoint_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection_fs.h"
#include "tests/daemon/service_util.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using testing::RankState;
using ::testing::SizeIs;

constexpr proto::Tier kMem = proto::TIER_MEMORY;
constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;
const uint64_t kSlot = RankState(1, 0).bytes();

class MemoryTierTest : public testing::ServiceTest {
 protected:
  // `slots` slots fit the budget; a save that finds it full is refused at
  // once (kSkip), so a save that succeeds found its room without waiting.
  ServiceOptions Options(int slots) {
    ServiceOptions o = ServiceTest::Options();
    o.staging.budget_bytes = slots * kSlot + 100;
    return o;
  }
  // A job of `world` ranks attached (as its trainers' Checkpointers do),
  // saving `steps` steps, each committed on disk; detached at the end.
  void RunJob(CheckpointService* service, const std::string& job,
              uint32_t world, uint64_t steps) {
    for (uint32_t r = 0; r < world; ++r) service->activity()->Attach(job);
    for (uint64_t step = 1; step <= steps; ++step) {
      for (uint32_t rank = 0; rank < world; ++rank) {
        absl::Status s =
            RankState(step, rank).Stage(service, job, step, rank, world);
        ASSERT_TRUE(s.ok()) << job << " step " << step << ": " << s;
      }
      auto c = service->WaitCommitted(job, step, kDisk, absl::Seconds(30));
      ASSERT_TRUE(c.ok()) << c.status();
      service->WaitIdle();
    }
    for (uint32_t r = 0; r < world; ++r) service->activity()->Detach(job);
  }
  // Job "stuck", whose trainers left, stages step 1 on two ranks while every
  // write fails: both shards fail to persist, and their slots are the only
  // copies of a step committed in memory.
  void StageUnpersistable(CheckpointService* service) {
    service->activity()->Attach("stuck");
    service->activity()->Detach("stuck");
    for (uint32_t rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(RankState(1, rank).Stage(service, "stuck", 1, rank, 2).ok());
    }
    EXPECT_FALSE(
        service->WaitCommitted("stuck", 1, kDisk, absl::Seconds(30)).ok());
    service->WaitIdle();
  }
  // Maps the slot of `job` step 1 rank 0 read-only, as a restore does.
  void ReadSlot(CheckpointService* service, const std::string& job,
                std::string* path, std::unique_ptr<io::MappedFile>* reader) {
    auto shard = service->GetShard(job, 1, 0);
    ASSERT_TRUE(shard.ok() && !shard->slot_path().empty());
    *path = shard->slot_path();
    auto mapped = io::DefaultFileSystem()->MapFile(*path, {.writable = false});
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    *reader = *std::move(mapped);
  }
};

// The user's report: three jobs run one after another leave their latest
// copies in memory; the fourth job could not save. Now the idle jobs' copies,
// safe on disk, give way, and their steps still restore from disk.
TEST_F(MemoryTierTest, JobsRunInSequenceEachSaveWithTheMemoryOfIdleOnes) {
  auto service = Start(io::DefaultFileSystem(), Options(6));
  for (const char* job : {"a", "b", "c"}) {
    ASSERT_NO_FATAL_FAILURE(RunJob(service.get(), job, 2, 3));
  }
  // A job holds two steps while it saves (the newer is staged before the
  // older leaves), so c already needed a's memory.
  EXPECT_FALSE(service->arena()->Find({"a", 3, 0}).ok());
  ASSERT_NO_FATAL_FAILURE(RunJob(service.get(), "d", 2, 3));
  // a went first (least recently active), then b; c was not needed.
  for (const char* job : {"a", "b"}) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      auto r = service->GetShard(job, 3, rank);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_THAT(r->slot_path(), IsEmpty()) << job;
      EXPECT_TRUE(RankState(3, rank).Check(r->shard_path()).ok()) << job;
    }
    EXPECT_TRUE(service->WaitCommitted(job, 3, kMem, absl::Seconds(1)).ok());
  }
  EXPECT_TRUE(service->arena()->Find({"c", 3, 0}).ok());
  const std::string metrics = service->metrics()->Render();
  EXPECT_THAT(metrics, HasSubstr("ckpt_memory_evictions_total{job=\"a\","
                                 "reason=\"idle_job\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("ckpt_memory_evictions_total{job=\"b\","
                                 "reason=\"idle_job\"} 2"));
  EXPECT_THAT(metrics, Not(HasSubstr("job=\"c\",reason=")));
}

// A step whose persist failed (ENOSPC) has its memory copy as its only copy:
// it stays, the save that needs its memory is refused, and the error says
// what holds the budget and why.
TEST_F(MemoryTierTest, TheOnlyCopyOfAStepStaysAndTheErrorSaysWhatHoldsIt) {
  io::FaultInjectionFs full(io::DefaultFileSystem());
  full.SetPersistentFaults(ENOSPC, 0);
  auto service = Start(&full, Options(2));
  ASSERT_NO_FATAL_FAILURE(StageUnpersistable(service.get()));
  auto refused = service->BeginStage("next", 1, 0, 1, kSlot);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  // The save found no room, so the failed persists are being tried again.
  const std::string message(refused.status().message());
  // (Its two slots are listed together, or apart while one of them is being
  // persisted again.)
  EXPECT_THAT(message, HasSubstr("held by: job stuck (no trainer attached) "
                                 "step 1: "))
      << message;
  // The persist tried again fails at once (ENOSPC at fallocate), so the
  // slots are listed as being tried again, or as failed again by the time
  // the message was made.
  EXPECT_THAT(message,
              AnyOf(HasSubstr("its persist failed and is being tried again "
                              "(writing shard "),
                    HasSubstr("its persist failed: the memory copy is the "
                              "only one (writing shard ")))
      << message;
  EXPECT_THAT(service->metrics()->Render(),
              HasSubstr("ckpt_persist_retries_total{job=\"stuck\"}"));
  EXPECT_TRUE(service->WaitCommitted("stuck", 1, kMem, absl::Seconds(1)).ok());
  EXPECT_TRUE(service->arena()->Find({"stuck", 1, 1}).ok());
  service->WaitIdle();  // the persists tried again meanwhile failed too
  // Nor does the operator's drop take them; it says why.
  auto drop = service->DropMemoryCopies("stuck", /*dry_run=*/false);
  ASSERT_TRUE(drop.ok()) << drop.status();
  EXPECT_THAT(drop->dropped, IsEmpty());
  ASSERT_THAT(drop->kept, SizeIs(2));
  EXPECT_THAT(drop->kept[0].second, HasSubstr("its persist failed"));
  EXPECT_TRUE(service->arena()->Find({"stuck", 1, 0}).ok());
}

// Memory is short and a step's only copy is in memory because its persist
// failed: once the disk fault passed, the persist is tried again, the step
// reaches the disk, and a save waiting for memory gets it.
TEST_F(MemoryTierTest, AFailedPersistIsTriedAgainWhenMemoryIsShort) {
  io::FaultInjectionFs disk(io::DefaultFileSystem());
  disk.SetPersistentFaults(ENOSPC, 0);
  ServiceOptions o = Options(2);
  o.staging.policy = FullPolicy::kWait;
  o.staging.wait_timeout = absl::Seconds(30);
  auto service = Start(&disk, o);
  ASSERT_NO_FATAL_FAILURE(StageUnpersistable(service.get()));
  disk.SetPersistentFaults(0, 0);  // space was freed
  auto slot = service->BeginStage("next", 1, 0, 1, kSlot,
                                  absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_TRUE(service->WaitCommitted("stuck", 1, kDisk, absl::Seconds(1)).ok());
  for (uint32_t rank = 0; rank < 2; ++rank) {
    auto r = service->GetShard("stuck", 1, rank);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(RankState(1, rank).Check(r->shard_path()).ok());
  }
  EXPECT_THAT(service->metrics()->Render(),
              HasSubstr("ckpt_persist_retries_total{job=\"stuck\"} 2"));
}

// A restore maps a slot read-only, which pins it: pressure does not take it,
// and once the reader is done it goes like any other.
TEST_F(MemoryTierTest, ASlotARestoreReadsIsKept) {
  auto service = Start(io::DefaultFileSystem(), Options(2));
  ASSERT_NO_FATAL_FAILURE(RunJob(service.get(), "a", 1, 1));
  std::string slot_path;
  std::unique_ptr<io::MappedFile> reader;
  ASSERT_NO_FATAL_FAILURE(ReadSlot(service.get(), "a", &slot_path, &reader));
  service->activity()->Attach("b");
  ASSERT_TRUE(RankState(1, 0).Stage(service.get(), "b", 1, 0, 2).ok());
  auto refused = service->BeginStage("b", 1, 1, 2, kSlot);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("job a (no trainer attached) step 1: 1 slot(s)"));
  EXPECT_THAT(refused.status().message(), HasSubstr("a reader holds it"));
  const RankState a(1, 0);
  EXPECT_EQ(std::memcmp(reader->data(), a.weights.data(), a.weights.size()), 0);
  reader.reset();  // the restore is done
  ASSERT_TRUE(RankState(1, 1).Stage(service.get(), "b", 1, 1, 2).ok());
  auto evicted = service->GetShard("a", 1, 0);
  ASSERT_TRUE(evicted.ok());
  EXPECT_THAT(evicted->slot_path(), IsEmpty());
  EXPECT_TRUE(a.Check(evicted->shard_path()).ok());
}

// A slot released while a reader holds it is deleted, never kept for the
// next save of its size: the reader's bytes are not written over.
TEST_F(MemoryTierTest, AReleasedSlotAReaderHoldsIsNeverReused) {
  auto service = Start(io::DefaultFileSystem(), Options(4));
  ASSERT_NO_FATAL_FAILURE(RunJob(service.get(), "a", 1, 1));
  std::string slot_path;
  std::unique_ptr<io::MappedFile> reader;
  ASSERT_NO_FATAL_FAILURE(ReadSlot(service.get(), "a", &slot_path, &reader));
  const uint64_t free_before = service->arena()->free_bytes();
  ASSERT_TRUE(service->arena()->Release({"a", 1, 0}).ok());
  EXPECT_EQ(service->arena()->free_bytes(), free_before);
  EXPECT_FALSE(std::filesystem::exists(slot_path));
  // Saves of the same size fill fresh slots; the reader still sees step 1.
  ASSERT_TRUE(RankState(2, 0).Stage(service.get(), "a", 2, 0, 1).ok());
  const RankState a(1, 0);
  EXPECT_EQ(std::memcmp(reader->data(), a.weights.data(), a.weights.size()), 0);
}

// A job whose trainers all detached gives up its memory copies once they are
// safe on disk and --idle-job-memory-ttl passed; an attached one keeps them.
TEST_F(MemoryTierTest, IdleJobsGiveUpTheirMemoryAfterTheTtl) {
  ServiceOptions o = Options(4);
  o.idle_job_memory_ttl = absl::Milliseconds(300);
  auto service = Start(io::DefaultFileSystem(), o);
  service->activity()->Attach("kept");
  ASSERT_TRUE(RankState(1, 0).Stage(service.get(), "kept", 1, 0, 1).ok());
  ASSERT_TRUE(service->WaitCommitted("kept", 1, kDisk, absl::Seconds(30)).ok());
  ASSERT_NO_FATAL_FAILURE(RunJob(service.get(), "idle", 1, 1));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (service->arena()->Find({"idle", 1, 0}).ok() &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE(service->arena()->Find({"idle", 1, 0}).ok());
  auto r = service->GetShard("idle", 1, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(RankState(1, 0).Check(r->shard_path()).ok());
  EXPECT_TRUE(service->arena()->Find({"kept", 1, 0}).ok());
  EXPECT_THAT(service->metrics()->Render(),
              HasSubstr("ckpt_memory_evictions_total{job=\"idle\","
                        "reason=\"idle_ttl\"} 1"));
}

// ckpt gc JOB --memory: the job's copies safe on disk go; a dry run only
// says so.
TEST_F(MemoryTierTest, TheOperatorDropsAJobsMemoryCopies) {
  auto service = Start(io::DefaultFileSystem(), Options(4));
  ASSERT_NO_FATAL_FAILURE(RunJob(service.get(), "a", 2, 1));
  auto dry = service->DropMemoryCopies("a", /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status();
  EXPECT_THAT(dry->dropped, SizeIs(2));
  EXPECT_TRUE(service->arena()->Find({"a", 1, 0}).ok());
  auto drop = service->DropMemoryCopies("a", /*dry_run=*/false);
  ASSERT_TRUE(drop.ok()) << drop.status();
  EXPECT_THAT(drop->dropped, SizeIs(2));
  EXPECT_EQ(service->arena()->used_bytes(), 0u);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    auto r = service->GetShard("a", 1, rank);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(RankState(1, rank).Check(r->shard_path()).ok());
  }
  EXPECT_EQ(service->DropMemoryCopies("../x", false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt::daemon
