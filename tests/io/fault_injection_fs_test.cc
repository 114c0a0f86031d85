// The fault-injecting file system must model failures faithfully, or the crash
// tests built on it prove nothing. These tests pin down its power-loss model
// and its injected errors.
#include "io/fault_injection_fs.h"

#include <cerrno>
#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/errno_status.h"
#include "tests/test_util.h"

namespace ckpt::io {
namespace {

using ::ckpt::testing::Text;

class FaultInjectionFsTest : public ::testing::Test {
 protected:
  // Creates `name` with `contents`, optionally fsyncing the file and its
  // directory.
  absl::Status Make(const std::string& name, absl::string_view contents,
                    bool sync_file, bool sync_dir) {
    auto file = fs_.NewWritableFile(dir_.File(name), {});
    if (!file.ok()) return file.status();
    absl::Status s = (*file)->Write(0, Text(contents));
    if (s.ok() && sync_file) s = (*file)->Sync();
    absl::Status c = (*file)->Close();
    if (s.ok()) s = c;
    if (s.ok() && sync_dir) s = fs_.SyncDir(dir_.path());
    return s;
  }
  bool Exists(const std::string& name) { return *fs_.Exists(dir_.File(name)); }
  std::string Contents(const std::string& name) {
    return testing::ReadAll(dir_.File(name));
  }

  testing::TempDir dir_;
  FaultInjectionFs fs_{DefaultFileSystem()};
};

TEST_F(FaultInjectionFsTest, PowerLossKeepsOnlyWhatWasSynced) {
  ASSERT_TRUE(Make("durable", "kept", true, true).ok());
  ASSERT_TRUE(Make("unsynced-data", "lost", false, true).ok());
  ASSERT_TRUE(Make("unsynced-name", "lost too", true, false).ok());
  ASSERT_TRUE(fs_.SimulatePowerLoss().ok());
  EXPECT_EQ(Contents("durable"), "kept");
  EXPECT_TRUE(Exists("unsynced-data"));
  EXPECT_EQ(Contents("unsynced-data"), "") << "its data was never fsynced";
  EXPECT_FALSE(Exists("unsynced-name"))
      << "its directory entry was never fsynced";
}

// ReplaceFileDurably: after it returns, a power loss keeps the new file; a
// failed fsync leaves the old one whole and no temporary file behind.
TEST_F(FaultInjectionFsTest, AFileReplacedDurablySurvivesAPowerLoss) {
  const std::string path = dir_.File("record.json");
  ASSERT_TRUE(ReplaceFileDurably(&fs_, path, "first").ok());
  ASSERT_TRUE(fs_.SimulatePowerLoss().ok());
  EXPECT_EQ(Contents("record.json"), "first");
  fs_.FailSyncAt(1, EIO);
  absl::Status s = ReplaceFileDurably(&fs_, path, "second");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(Contents("record.json"), "first");
  EXPECT_FALSE(Exists("record.json.tmp"));
  ASSERT_TRUE(ReplaceFileDurably(&fs_, path, "third").ok());
  ASSERT_TRUE(fs_.SimulatePowerLoss().ok());
  EXPECT_EQ(Contents("record.json"), "third");
}

TEST_F(FaultInjectionFsTest, PreexistingFilesAreDurable) {
  testing::WriteAll(dir_.File("old"), "from before");
  ASSERT_TRUE(Make("new", "x", true, false).ok());
  ASSERT_TRUE(fs_.SimulatePowerLoss().ok());
  EXPECT_EQ(Contents("old"), "from before");
  EXPECT_FALSE(Exists("new"));
}

TEST_F(FaultInjectionFsTest, RenameIsUndoneWithoutDirectorySync) {
  testing::WriteAll(dir_.File("target"), "old version");
  ASSERT_TRUE(Make("target.tmp", "new version", true, false).ok());
  ASSERT_TRUE(fs_.Rename(dir_.File("target.tmp"), dir_.File("target")).ok());
  EXPECT_EQ(Contents("target"), "new version");
  ASSERT_TRUE(fs_.SimulatePowerLoss().ok());
  EXPECT_EQ(Contents("target"), "old version");
  EXPECT_FALSE(Exists("target.tmp"));

  ASSERT_TRUE(Make("target.tmp", "new version", true, false).ok());
  ASSERT_TRUE(fs_.Rename(dir_.File("target.tmp"), dir_.File("target")).ok());
  ASSERT_TRUE(fs_.SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_.SimulatePowerLoss().ok());
  EXPECT_EQ(Contents("target"), "new version");
}

TEST_F(FaultInjectionFsTest, FailedFsyncLosesTheDataEvenIfALaterFsyncSucceeds) {
  fs_.FailSyncAt(1, EIO);
  auto file = fs_.NewWritableFile(dir_.File("f"), {});
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Write(0, Text("data")).ok());
  absl::Status s = (*file)->Sync();
  EXPECT_EQ(StatusErrno(s), EIO);
  EXPECT_TRUE((*file)->Sync().ok()) << "like Linux, the error is reported once";
  ASSERT_TRUE((*file)->Close().ok());
  ASSERT_TRUE(fs_.SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_.SimulatePowerLoss().ok());
  EXPECT_EQ(Contents("f"), "")
      << "the retried fsync must not have made the data durable";
}

TEST_F(FaultInjectionFsTest, WriteFaultsFireAtTheNthWrite) {
  fs_.FailWriteAt(2, ENOSPC);
  auto file = fs_.NewWritableFile(dir_.File("f"), {});
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->Write(0, Text("one")).ok());
  absl::Status s = (*file)->Write(3, Text("two"));
  EXPECT_EQ(StatusErrno(s), ENOSPC);
  EXPECT_THAT(s.message(), ::testing::HasSubstr(dir_.File("f")));
  EXPECT_TRUE((*file)->Write(3, Text("three")).ok()) << "each fault fires once";
  EXPECT_EQ(fs_.writes(), 3);
}

TEST_F(FaultInjectionFsTest, ShortWritePersistsAPrefixAndFails) {
  fs_.ShortWriteAt(1, ENOSPC);
  auto file = fs_.NewWritableFile(dir_.File("f"), {});
  ASSERT_TRUE(file.ok());
  std::string data(3 * 4096, 'x');
  absl::Status s = (*file)->Write(0, Text(data));
  EXPECT_EQ(StatusErrno(s), ENOSPC);
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(Contents("f").size(), 4096u);
}

TEST_F(FaultInjectionFsTest, BorrowedWritesTakeTheSameFaultsAndPowerLoss) {
  const std::string data(3 * 4096, 'b');
  const auto bytes = absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>(data.data()), data.size());
  fs_.ShortWriteAt(1, EIO);
  {
    auto file = fs_.NewWritableFile(dir_.File("short"), {});
    ASSERT_TRUE(file.ok());
    EXPECT_EQ(StatusErrno((*file)->WriteBorrowed(0, bytes)), EIO);
    ASSERT_TRUE((*file)->Close().ok());
  }
  EXPECT_EQ(Contents("short"), data.substr(0, 4096));
  // Unsynced borrowed bytes are lost with the power; synced ones stay.
  {
    auto file = fs_.NewWritableFile(dir_.File("kept"), {});
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->WriteBorrowed(0, bytes).ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->WriteBorrowed(data.size(), bytes).ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  ASSERT_TRUE(fs_.SyncDir(dir_.path()).ok());
  ASSERT_TRUE(fs_.SimulatePowerLoss().ok());
  EXPECT_EQ(Contents("kept"), data);
}

TEST_F(FaultInjectionFsTest, PowerOutFailsEverythingAfterTheNthMutation) {
  fs_.PowerLossAfter(2);  // create, write; then the sync fails
  auto file = fs_.NewWritableFile(dir_.File("f"), {});
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Write(0, Text("data")).ok());
  EXPECT_EQ(StatusErrno((*file)->Sync()), EIO);
  EXPECT_FALSE(fs_.Rename(dir_.File("f"), dir_.File("g")).ok());
  ASSERT_TRUE((*file)->Close().ok());
  ASSERT_TRUE(fs_.SimulatePowerLoss().ok());
  EXPECT_FALSE(Exists("f"));
  EXPECT_TRUE(fs_.Rename(dir_.File("nothing"), dir_.File("g")).code() ==
              absl::StatusCode::kNotFound)
      << "power is back after SimulatePowerLoss";
}

TEST_F(FaultInjectionFsTest, TornWritesPersistAPrefixOfUnsyncedWrites) {
  uint64_t seed = testing::TestSeed();
  std::string full;
  for (int i = 0; i < 8; ++i)
    full += std::string(1024, static_cast<char>('a' + i));
  bool saw_partial = false;
  for (int round = 0; round < 20; ++round) {
    FaultInjectionFs fs(DefaultFileSystem());
    fs.EnableTornWrites(seed + round);
    auto file = fs.NewWritableFile(dir_.File("t"), {});
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE(fs.SyncDir(dir_.path()).ok());
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(
          (*file)->Write(i * 1024, Text(full.substr(i * 1024, 1024))).ok());
    }
    ASSERT_TRUE((*file)->Close().ok());
    ASSERT_TRUE(fs.SimulatePowerLoss().ok());
    std::string after = Contents("t");
    ASSERT_LE(after.size(), full.size());
    EXPECT_EQ(after, full.substr(0, after.size()))
        << "a torn file holds a prefix of the writes";
    EXPECT_EQ(after.size() % 512, 0u);
    if (!after.empty() && after.size() < full.size()) saw_partial = true;
  }
  EXPECT_TRUE(saw_partial);
}

TEST_F(FaultInjectionFsTest, PersistentFaultsHoldUntilSwitchedOff) {
  fs_.DisableDurabilityModel();
  fs_.SetPersistentFaults(ENOSPC, 0);
  for (int i = 0; i < 3; ++i) {
    absl::Status s = Make("full", "no room", false, false);
    EXPECT_EQ(s.code(), ErrnoToStatus(ENOSPC, "").code()) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("injected"));
  }
  auto file = fs_.NewWritableFile(dir_.File("alloc"), {});
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE((*file)->Allocate(4096).ok());
  ASSERT_TRUE((*file)->Close().ok());
  fs_.SetPersistentFaults(0, EIO);
  absl::Status s = Make("sync", "data", true, false);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("fsync"));
  fs_.SetPersistentFaults(0, 0);
  ASSERT_TRUE(Make("fine", "written", true, true).ok());
  EXPECT_EQ(Contents("fine"), "written");
  EXPECT_EQ(fs_.SimulatePowerLoss().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ckpt::io
