// The journal model of FaultInjectionFs, as ckptd runs it under ckpt-chaos's
// power_loss fault: the power is cut in the live process, and the plan is
// carried out on the real files afterwards. What was fsynced (data, and names
// whose directory was fsynced) must survive exactly; nothing else may survive
// as if it had been.
#include "io/unsynced_journal.h"

#include <cerrno>
#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/errno_status.h"
#include "io/fault_injection_fs.h"
#include "tests/test_util.h"

namespace ckpt::io {
namespace {

using ::ckpt::testing::Text;

class UnsyncedJournalTest : public ::testing::Test {
 protected:
  UnsyncedJournalTest() { fs_.ModelDurabilityByJournal(); }

  // Writes `contents` at `offset` of `name` (created or, without `truncate`,
  // written over), optionally fsyncing the file.
  void Write(const std::string& name, uint64_t offset,
             absl::string_view contents, bool sync, bool truncate = true) {
    auto file = fs_.NewWritableFile(dir_.File(name), {.truncate = truncate});
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->Write(offset, Text(contents)).ok());
    if (sync) {
      ASSERT_TRUE((*file)->Sync().ok());
    }
    ASSERT_TRUE((*file)->Close().ok());
  }
  void SyncDir() { ASSERT_TRUE(fs_.SyncDir(dir_.path()).ok()); }
  void PowerLoss() {
    absl::StatusOr<std::string> plan = fs_.CutPower();
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::Status s = ApplyPowerLossPlan(DefaultFileSystem(), *plan);
    ASSERT_TRUE(s.ok()) << s << "\nplan:\n" << *plan;
  }
  bool Exists(const std::string& name) {
    return *DefaultFileSystem()->Exists(dir_.File(name));
  }
  std::string Contents(const std::string& name) {
    return testing::ReadAll(dir_.File(name));
  }

  testing::TempDir dir_;
  FaultInjectionFs fs_{DefaultFileSystem()};
};

TEST_F(UnsyncedJournalTest, KeepsExactlyWhatWasSynced) {
  Write("durable", 0, "kept", true);
  Write("unsynced-data", 0, "lost", false);
  SyncDir();
  Write("unsynced-name", 0, "lost too", true);
  PowerLoss();
  EXPECT_EQ(Contents("durable"), "kept");
  EXPECT_EQ(Contents("unsynced-data"), "") << "its data was never fsynced";
  EXPECT_FALSE(Exists("unsynced-name"))
      << "its directory entry was never fsynced";
}

TEST_F(UnsyncedJournalTest, AnUnsyncedRenameIsUndone) {
  // The shard writer's pattern: temporary name, fsync, rename, fsync of the
  // directory. Without the last step the final name is not durable.
  Write("shard.tmp", 0, "shard bytes", true);
  SyncDir();
  ASSERT_TRUE(fs_.Rename(dir_.File("shard.tmp"), dir_.File("shard")).ok());
  Write("other.tmp", 0, "other", true);
  SyncDir();
  ASSERT_TRUE(fs_.Rename(dir_.File("other.tmp"), dir_.File("other")).ok());
  PowerLoss();
  EXPECT_EQ(Contents("shard"), "shard bytes");
  EXPECT_FALSE(Exists("shard.tmp"));
  EXPECT_FALSE(Exists("other"));
  EXPECT_EQ(Contents("other.tmp"), "other");
}

TEST_F(UnsyncedJournalTest, AReplacedNameComesBackUntilItsDirectoryIsSynced) {
  Write("manifest", 0, "old", true);
  Write("manifest.tmp", 0, "new", true);
  SyncDir();
  ASSERT_TRUE(
      fs_.Rename(dir_.File("manifest.tmp"), dir_.File("manifest")).ok());
  auto names = fs_.ListDir(dir_.path());
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ::testing::UnorderedElementsAre("manifest"))
      << "the kept link is hidden";
  PowerLoss();
  EXPECT_EQ(Contents("manifest"), "old");
  EXPECT_EQ(Contents("manifest.tmp"), "new");
  auto after = DefaultFileSystem()->ListDir(dir_.path());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size(), 2u) << "no kept link left behind";
}

TEST_F(UnsyncedJournalTest, ASyncedDirectoryDropsTheKeptLink) {
  Write("a", 0, "old", true);
  Write("b", 0, "new", true);
  SyncDir();
  ASSERT_TRUE(fs_.Rename(dir_.File("b"), dir_.File("a")).ok());
  SyncDir();
  auto names = DefaultFileSystem()->ListDir(dir_.path());
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ::testing::UnorderedElementsAre("a"));
  PowerLoss();
  EXPECT_EQ(Contents("a"), "new");
}

TEST_F(UnsyncedJournalTest, UnsyncedRangesOfAFileWrittenOverAreGarbage) {
  // A recycled file: its old blocks are written over in place.
  const std::string old(8192, 'o');
  Write("recycled", 0, old, true);
  SyncDir();
  Write("recycled", 4096, std::string(4096, 'n'), false, /*truncate=*/false);
  Write("recycled", 8192, std::string(4096, 'x'), false, /*truncate=*/false);
  PowerLoss();
  const std::string after = Contents("recycled");
  ASSERT_EQ(after.size(), 8192u) << "cut back to the size last fsynced";
  EXPECT_EQ(after.substr(0, 4096), old.substr(0, 4096));
  EXPECT_NE(after.substr(4096), std::string(4096, 'n'));
  EXPECT_NE(after.substr(4096), old.substr(4096));
}

TEST_F(UnsyncedJournalTest, WhatAFailedFsyncLostStaysLost) {
  Write("f", 0, std::string(4096, 'a'), true);
  SyncDir();
  fs_.FailSyncAt(fs_.syncs() + 1, EIO);
  auto file = fs_.NewWritableFile(dir_.File("f"), {.truncate = false});
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Write(0, Text(std::string(4096, 'b'))).ok());
  EXPECT_FALSE((*file)->Sync().ok());
  EXPECT_TRUE((*file)->Sync().ok()) << "Linux: the next fsync succeeds";
  ASSERT_TRUE((*file)->Close().ok());
  PowerLoss();
  const std::string after = Contents("f");
  EXPECT_NE(after, std::string(4096, 'b'));
  EXPECT_NE(after, std::string(4096, 'a'));
}

TEST_F(UnsyncedJournalTest, AfterThePowerIsCutNothingMutates) {
  auto file = fs_.NewWritableFile(dir_.File("open"), {});
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(fs_.CutPower().ok());
  absl::Status s = (*file)->Write(0, Text("late"));
  if (s.ok()) s = (*file)->Sync();
  EXPECT_EQ(s.code(), ErrnoToStatus(EIO, "").code()) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("power"));
  EXPECT_FALSE(fs_.SyncDir(dir_.path()).ok());
  EXPECT_FALSE(fs_.Rename(dir_.File("open"), dir_.File("moved")).ok());
  EXPECT_FALSE(fs_.NewWritableFile(dir_.File("new"), {}).ok());
  (void)(*file)->Close();
}

TEST_F(UnsyncedJournalTest, CutPowerNeedsTheJournalModel) {
  FaultInjectionFs copies(DefaultFileSystem());
  EXPECT_EQ(copies.CutPower().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fs_.SimulatePowerLoss().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(UnsyncedJournalTest, ABadPlanLineIsNamed) {
  absl::Status s = ApplyPowerLossPlan(DefaultFileSystem(), "X\tnonsense\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("nonsense"));
}

}  // namespace
}  // namespace ckpt::io
