// The commit guarantee of a shard under every failure the fault-injecting file
// system can produce at every step of a small snapshot's write, and under
// SIGKILL of a real process at every kill point: the writer reports the error,
// a previously committed shard still reads back byte-exact, and the new shard
// is either complete or invisible.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "gtest/gtest.h"
#include "io/fault_injection_fs.h"
#include "io/file_system.h"
#include "tests/snapshot/sample_shard.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = testing::TestSeed();
    old_ = std::make_unique<testing::SampleShard>(seed_ + 1);
    new_ = std::make_unique<testing::SampleShard>(seed_ + 2);
  }

  // After a failed or interrupted write of step 2: step 1 intact, step 2
  // complete or absent, and no temporary file masquerading as a shard.
  void ExpectCommitGuarantee(io::FileSystem* fs, const std::string& dir,
                             const std::string& what) {
    SCOPED_TRACE(what);
    absl::Status old_ok = old_->Check(fs, dir + "/step-1.shard");
    EXPECT_TRUE(old_ok.ok()) << "committed shard damaged: " << old_ok;
    const std::string fresh = dir + "/step-2.shard";
    if (*fs->Exists(fresh)) {
      absl::Status new_ok = new_->Check(fs, fresh);
      EXPECT_TRUE(new_ok.ok()) << "visible but incomplete: " << new_ok;
    }
  }

  uint64_t seed_;
  std::unique_ptr<testing::SampleShard> old_, new_;
};

// How many writes, syncs and mutations one clean write of the new shard takes.
struct Counts {
  int writes, syncs, mutations;
};
Counts CleanRunCounts(const testing::SampleShard& shard) {
  testing::TempDir dir;
  io::FaultInjectionFs fs(io::DefaultFileSystem());
  EXPECT_TRUE(shard.Write(&fs, dir.File("step-2.shard"), 2).ok());
  return {fs.writes(), fs.syncs(), fs.mutations()};
}

enum class Fault {
  kEnospcWrite,
  kEioWrite,
  kShortWrite,
  kEioSync,
  kEioDirSync
};

TEST_F(CrashTest, EveryWriteAndSyncFaultKeepsTheCommitGuarantee) {
  const Counts counts = CleanRunCounts(*new_);
  ASSERT_GE(counts.writes, 6) << "several chunks plus the tail";
  struct Case {
    Fault fault;
    const char* name;
    int count;
  };
  const Case cases[] = {{Fault::kEnospcWrite, "ENOSPC at write", counts.writes},
                        {Fault::kEioWrite, "EIO at write", counts.writes},
                        {Fault::kShortWrite, "short write", counts.writes},
                        {Fault::kEioSync, "EIO on fsync", counts.syncs},
                        {Fault::kEioDirSync, "EIO on directory fsync", 1}};
  for (const Case& c : cases) {
    for (int n = 1; n <= c.count; ++n) {
      testing::TempDir dir;
      io::FaultInjectionFs fs(io::DefaultFileSystem());
      ASSERT_TRUE(old_->Write(&fs, dir.File("step-1.shard"), 1).ok());
      switch (c.fault) {
        case Fault::kEnospcWrite:
          fs.FailWriteAt(fs.writes() + n, ENOSPC);
          break;
        case Fault::kEioWrite:
          fs.FailWriteAt(fs.writes() + n, EIO);
          break;
        case Fault::kShortWrite:
          fs.ShortWriteAt(fs.writes() + n, ENOSPC);
          break;
        case Fault::kEioSync:
          fs.FailSyncAt(fs.syncs() + n, EIO);
          break;
        case Fault::kEioDirSync:
          fs.FailSyncDirAt(1 + n, EIO);
          break;
      }
      std::string what = std::string(c.name) + " " + std::to_string(n);
      absl::Status s = new_->Write(&fs, dir.File("step-2.shard"), 2);
      EXPECT_FALSE(s.ok()) << what << ": the writer must report the fault";
      EXPECT_NE(s.message().find("step-2.shard"), absl::string_view::npos) << s;
      if (c.fault != Fault::kEioDirSync) {
        EXPECT_FALSE(*fs.Exists(dir.File("step-2.shard"))) << what;
        EXPECT_FALSE(*fs.Exists(dir.File("step-2.shard.tmp")))
            << what << ": temp not removed";
      }
      ExpectCommitGuarantee(&fs, dir.path(), what);
      // Power loss after the failure changes nothing about the guarantee.
      ASSERT_TRUE(fs.SimulatePowerLoss().ok());
      ExpectCommitGuarantee(&fs, dir.path(), what + " + power loss");
      // Space is back: the next save succeeds.
      ASSERT_TRUE(new_->Write(&fs, dir.File("step-2.shard"), 2).ok()) << what;
      EXPECT_TRUE(new_->Check(&fs, dir.File("step-2.shard")).ok());
    }
  }
}

TEST_F(CrashTest, PowerLossAtEveryStepOfTheCommit) {
  const Counts counts = CleanRunCounts(*new_);
  for (bool torn : {false, true}) {
    for (int n = 0; n <= counts.mutations; ++n) {
      testing::TempDir dir;
      io::FaultInjectionFs fs(io::DefaultFileSystem());
      if (torn) fs.EnableTornWrites(seed_ + n);
      ASSERT_TRUE(old_->Write(&fs, dir.File("step-1.shard"), 1).ok());
      fs.PowerLossAfter(fs.mutations() + n);
      absl::Status s = new_->Write(&fs, dir.File("step-2.shard"), 2);
      EXPECT_EQ(s.ok(), n == counts.mutations)
          << "power lost after " << n << ": " << s;
      ASSERT_TRUE(fs.SimulatePowerLoss().ok());
      std::string what = "power lost after mutation " + std::to_string(n) +
                         (torn ? " (torn)" : "");
      ExpectCommitGuarantee(&fs, dir.path(), what);
      if (n == counts.mutations) {
        EXPECT_TRUE(*fs.Exists(dir.File("step-2.shard")))
            << "a committed shard survives";
      }
    }
  }
}

TEST_F(CrashTest, SigkillAtEveryKillPoint) {
  const char* points[] = {"shard.chunk_written:1", "shard.chunk_written:4",
                          "shard.before_sync",     "shard.after_sync",
                          "shard.after_rename",    "shard.after_dir_sync"};
  for (const char* point : points) {
    testing::TempDir dir;
    ASSERT_TRUE(
        old_->Write(io::DefaultFileSystem(), dir.File("step-1.shard"), 1).ok());
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::setenv("CKPT_KILL_POINT", point, 1);
      std::string seed = std::to_string(seed_);
      ::execl(CKPT_CRASH_HELPER, CKPT_CRASH_HELPER, dir.path().c_str(), "2",
              seed.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << point << ": the helper was not killed (status " << status << ")";
    ExpectCommitGuarantee(io::DefaultFileSystem(), dir.path(), point);
    bool renamed = std::string(point) == "shard.after_rename" ||
                   std::string(point) == "shard.after_dir_sync";
    EXPECT_EQ(*io::DefaultFileSystem()->Exists(dir.File("step-2.shard")),
              renamed)
        << point;
  }
}

}  // namespace
}  // namespace ckpt::snapshot
