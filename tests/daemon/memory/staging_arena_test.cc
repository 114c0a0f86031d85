#include "daemon/memory/staging_arena.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection_fs.h"
#include "io/file_system.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

class StagingArenaTest : public ::testing::Test {
 protected:
  std::unique_ptr<StagingArena> Open(
      uint64_t budget, FullPolicy policy,
      absl::Duration timeout = absl::Seconds(5)) {
    auto arena = StagingArena::Open(
        io::DefaultFileSystem(),
        StagingOptions{dir_.File("staging"), budget, policy, timeout});
    EXPECT_TRUE(arena.ok()) << arena.status();
    return arena.ok() ? *std::move(arena) : nullptr;
  }
  testing::TempDir dir_;
};

TEST_F(StagingArenaTest, SlotsAreMappableFilesOwnedByTheDaemonUser) {
  auto arena = Open(1 << 20, FullPolicy::kSkip);
  auto slot = arena->Allocate({"job", 3, 1}, 100000);
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(arena->used_bytes(), 100000u);
  struct stat st;
  ASSERT_EQ(::stat(slot->path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 100000u);
  ASSERT_EQ(::stat(dir_.File("staging").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // A trainer maps and fills it; the daemon reads the same bytes.
  auto mapped = io::DefaultFileSystem()->MapFile(slot->path, {});
  ASSERT_TRUE(mapped.ok());
  (*mapped)->data()[99999] = 42;
  auto again =
      io::DefaultFileSystem()->MapFile(slot->path, {.writable = false});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->data()[99999], 42);
  EXPECT_EQ(arena->Allocate({"job", 3, 1}, 10).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(arena->Release({"job", 3, 1}).ok());
  EXPECT_EQ(arena->used_bytes(), 0u);
  EXPECT_FALSE(*io::DefaultFileSystem()->Exists(slot->path));
  EXPECT_EQ(arena->Release({"job", 3, 1}).code(), absl::StatusCode::kNotFound);
}

TEST_F(StagingArenaTest, SkipPolicyRefusesAtOnceAndSaysWhy) {
  auto arena = Open(1000, FullPolicy::kSkip);
  ASSERT_TRUE(arena->Allocate({"job", 1, 0}, 600).ok());
  auto refused = arena->Allocate({"job", 2, 0}, 600);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("600 of 1000 bytes are in use"));
  EXPECT_THAT(refused.status().message(), HasSubstr("policy: skip"));
  auto huge = arena->Allocate({"job", 3, 0}, 5000);
  EXPECT_THAT(huge.status().message(),
              HasSubstr("more than the whole memory budget"));
  EXPECT_EQ(arena->used_bytes(), 600u) << "refusals reserve nothing";
}

TEST_F(StagingArenaTest, WaitPolicyWaitsForSpaceThenTimesOut) {
  auto arena = Open(1000, FullPolicy::kWait, absl::Seconds(30));
  ASSERT_TRUE(arena->Allocate({"job", 1, 0}, 600).ok());
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(arena->Release({"job", 1, 0}).ok());
  });
  auto waited = arena->Allocate({"job", 2, 0}, 600);
  releaser.join();
  EXPECT_TRUE(waited.ok()) << waited.status();

  auto short_wait = Open(1000, FullPolicy::kWait, absl::Milliseconds(50));
  ASSERT_TRUE(short_wait->Allocate({"other", 1, 0}, 900).ok());
  auto timed_out = short_wait->Allocate({"other", 2, 0}, 200);
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(timed_out.status().message(), HasSubstr("after waiting"));
}

TEST_F(StagingArenaTest, RecoverAdoptsKeptSlotsAndDeletesTheRest) {
  {
    auto arena = Open(1 << 20, FullPolicy::kSkip);
    ASSERT_TRUE(arena->Allocate({"job", 1, 0}, 100).ok());
    ASSERT_TRUE(arena->Allocate({"job", 2, 0}, 200).ok());
    ASSERT_TRUE(arena->Allocate({"job", 2, 1}, 300).ok());
  }
  testing::WriteAll(dir_.File("staging/job/garbage"), "x");
  auto arena = Open(1 << 20, FullPolicy::kSkip);
  auto adopted =
      arena->Recover([](const SlotInfo& s) { return s.id.step == 2; });
  ASSERT_TRUE(adopted.ok());
  ASSERT_EQ(adopted->size(), 2u);
  EXPECT_EQ(arena->used_bytes(), 500u);
  EXPECT_TRUE(arena->Find({"job", 2, 1}).ok());
  EXPECT_FALSE(arena->Find({"job", 1, 0}).ok());
  EXPECT_FALSE(
      *io::DefaultFileSystem()->Exists(dir_.File("staging/job/garbage")));
  EXPECT_FALSE(
      *io::DefaultFileSystem()->Exists(arena->SlotPath({"job", 1, 0})));
}

TEST_F(StagingArenaTest, ReleasedSlotsAreReusedAndEvictedUnderPressure) {
  auto arena = Open(1000, FullPolicy::kSkip);
  auto first = arena->Allocate({"job", 1, 0}, 400);
  ASSERT_TRUE(first.ok());
  struct stat st;
  ASSERT_EQ(::stat(first->path.c_str(), &st), 0);
  const ino_t inode = st.st_ino;
  ASSERT_TRUE(arena->Release({"job", 1, 0}).ok());
  EXPECT_EQ(arena->used_bytes(), 0u);
  EXPECT_EQ(arena->free_bytes(), 400u) << "kept for the next slot of that size";
  auto second = arena->Allocate({"job", 2, 0}, 400);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(::stat(second->path.c_str(), &st), 0);
  EXPECT_EQ(st.st_ino, inode) << "the same tmpfs pages, renamed into place";
  EXPECT_EQ(arena->free_bytes(), 0u);
  // A kept slot gives its memory back when a new slot needs it.
  ASSERT_TRUE(arena->Release({"job", 2, 0}).ok());
  auto big = arena->Allocate({"job", 3, 0}, 900);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(arena->free_bytes(), 0u);
  EXPECT_EQ(arena->used_bytes(), 900u);
}

// A slot made ahead in the background is what the next Allocate of its size
// takes; it is made only with room for it and one more slot of its size.
TEST_F(StagingArenaTest, ASlotPreparedAheadIsTakenByTheNextAllocation) {
  auto arena = Open(1300, FullPolicy::kSkip);
  ASSERT_TRUE(arena->Allocate({"job", 1, 0}, 400).ok());
  arena->PrepareAhead(400);
  for (int i = 0; i < 500 && arena->prepared() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_EQ(arena->prepared(), 1u);
  EXPECT_EQ(arena->free_bytes(), 400u);
  arena->PrepareAhead(400);  // one of that size is free already
  auto second = arena->Allocate({"job", 2, 0}, 400);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(arena->free_bytes(), 0u) << "the prepared slot was taken";
  EXPECT_EQ(arena->used_bytes(), 800u);
  // 800 in use: no room for 400 and 400 more, so nothing is made, and the
  // next slot still fits.
  arena->PrepareAhead(400);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(arena->prepared(), 1u);
  EXPECT_EQ(arena->free_bytes(), 0u);
  ASSERT_TRUE(arena->Allocate({"job", 3, 0}, 400).ok());
  auto refused = arena->Allocate({"job", 4, 0}, 400);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
}

// A job whose state changed size: the free slot of the old size makes room
// for one of the new size, made ahead.
TEST_F(StagingArenaTest, FreeSlotsOfAnotherSizeGiveWayToOnePreparedAhead) {
  auto arena = Open(1300, FullPolicy::kSkip);
  ASSERT_TRUE(arena->Allocate({"job", 1, 0}, 600).ok());
  ASSERT_TRUE(arena->Release({"job", 1, 0}).ok());
  ASSERT_EQ(arena->free_bytes(), 600u);
  ASSERT_TRUE(arena->Allocate({"job", 2, 0}, 400).ok());
  EXPECT_EQ(arena->free_bytes(), 600u) << "kept while the budget has room";
  arena->PrepareAhead(400);
  for (int i = 0; i < 500 && arena->prepared() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_EQ(arena->prepared(), 1u);
  EXPECT_EQ(arena->free_bytes(), 400u) << "the 600-byte slot gave way";
  auto next = arena->Allocate({"job", 3, 0}, 400);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(arena->free_bytes(), 0u);
  auto files = io::DefaultFileSystem()->ListDir(dir_.File("staging/+free"));
  ASSERT_TRUE(files.ok());
  EXPECT_TRUE(files->empty()) << "the dropped slot's file is gone";
}

// A slot adopted after a restart has never been mapped by this daemon; once
// released it must still be reusable (it used to fail with "File exists").
TEST_F(StagingArenaTest, AdoptedSlotIsReusedAfterRelease) {
  {
    auto arena = Open(1 << 20, FullPolicy::kSkip);
    ASSERT_TRUE(arena->Allocate({"job", 1, 0}, 4096).ok());
  }
  auto arena = Open(1 << 20, FullPolicy::kSkip);
  ASSERT_TRUE(arena->Recover([](const SlotInfo&) { return true; }).ok());
  ASSERT_TRUE(arena->Release({"job", 1, 0}).ok());
  auto again = arena->Allocate({"job", 2, 0}, 4096);
  ASSERT_TRUE(again.ok()) << again.status();
  auto map = arena->Map({"job", 2, 0});
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ((*map)->size(), 4096u);
}

// The daemon maps a slot once; the mapping follows the slot through the free
// list into its next use and shows what a writer put into the file.
TEST_F(StagingArenaTest, MappingIsKeptAcrossReuse) {
  auto arena = Open(1 << 20, FullPolicy::kSkip);
  auto slot = arena->Allocate({"job", 1, 0}, 8192);
  ASSERT_TRUE(slot.ok());
  auto first = arena->Map({"job", 1, 0});
  ASSERT_TRUE(first.ok()) << first.status();
  const uint8_t* data = (*first)->data();
  first->reset();
  ASSERT_TRUE(arena->Release({"job", 1, 0}).ok());
  auto second = arena->Allocate({"job", 2, 0}, 8192);
  ASSERT_TRUE(second.ok());
  auto writer = io::DefaultFileSystem()->MapFile(second->path, {});
  ASSERT_TRUE(writer.ok());
  (*writer)->data()[100] = 42;
  auto map = arena->Map({"job", 2, 0});
  ASSERT_TRUE(map.ok());
  EXPECT_EQ((*map)->data(), data) << "not mapped again";
  EXPECT_EQ((*map)->data()[100], 42);
  EXPECT_FALSE(arena->Map({"job", 1, 0}).ok()) << "released slots are gone";
}

// A reader (a restore) holds a slot against reuse whichever moment of the
// release it locks at: up to the rename that retires the slot, the slot is not
// kept for the next save; opened before but locked after it, the reader
// learns that the name is gone and falls back instead of reading a slot that
// the next save writes over.
TEST_F(StagingArenaTest, ASlotBeingReadIsNeverHandedToTheNextSave) {
  io::FaultInjectionFs fs(io::DefaultFileSystem());
  auto opened = StagingArena::Open(
      &fs, StagingOptions{dir_.File("staging"), 1 << 20, FullPolicy::kSkip,
                          absl::Seconds(5)});
  ASSERT_TRUE(opened.ok()) << opened.status();
  StagingArena& arena = **opened;
  ASSERT_TRUE(arena.Allocate({"job", 1, 0}, 8192).ok());
  const std::string path = arena.SlotPath({"job", 1, 0});
  // The reader locks just before the slot is renamed: after any check the
  // release could make before its rename.
  std::unique_ptr<io::MappedFile> reader;
  fs.BeforeRename([&](const std::string& from) {
    if (from != path || reader != nullptr) return;
    auto mapped = io::DefaultFileSystem()->MapFile(path, {.writable = false});
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    reader = *std::move(mapped);
  });
  ASSERT_TRUE(arena.Release({"job", 1, 0}).ok());
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(arena.free_bytes(), 0u) << "read: not kept for reuse";
  EXPECT_EQ(reader->size(), 8192u) << "the reader keeps its pages";
  reader.reset();
  fs.BeforeRename(nullptr);

  ASSERT_TRUE(arena.Allocate({"job", 2, 0}, 8192).ok());
  const std::string second = arena.SlotPath({"job", 2, 0});
  const int fd = ::open(second.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(arena.Release({"job", 2, 0}).ok());
  EXPECT_EQ(arena.free_bytes(), 8192u) << "not locked yet: kept for reuse";
  EXPECT_EQ(io::LockForReading(fd, second).code(), absl::StatusCode::kNotFound)
      << "a reader that locks after the release must not read the slot";
  ::close(fd);
}

TEST_F(StagingArenaTest, RefusesBadNamesAndPlantedSymlinks) {
  auto arena = Open(1 << 20, FullPolicy::kSkip);
  EXPECT_EQ(arena->Allocate({"../etc", 1, 0}, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arena->Allocate({std::string("a\0b", 3), 1, 0}, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      io::DefaultFileSystem()->CreateDirs(dir_.File("staging/job")).ok());
  testing::WriteAll(dir_.File("victim"), "precious");
  ASSERT_EQ(::symlink(dir_.File("victim").c_str(),
                      arena->SlotPath({"job", 9, 0}).c_str()),
            0);
  auto planted = arena->Allocate({"job", 9, 0}, 4096);
  EXPECT_FALSE(planted.ok());
  EXPECT_EQ(testing::ReadAll(dir_.File("victim")), "precious");
  EXPECT_EQ(arena->used_bytes(), 0u);
}

}  // namespace
}  // namespace ckpt::daemon
