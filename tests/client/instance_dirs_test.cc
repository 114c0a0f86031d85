// One ckptd per directory and socket, and only directories that are its own:
// real ckptd processes. A second daemon on a running one's data directory,
// staging directory or socket is refused with the first one's pid, and the
// first one's staged slots and socket are untouched; a staging directory that
// is a symlink or another user's is refused at start; what ckptd creates is
// private to its uid.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

using ::testing::HasSubstr;

// path -> size of every file under `dir`.
std::map<std::string, uintmax_t> FilesUnder(const std::string& dir) {
  std::map<std::string, uintmax_t> files;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); ++it) {
    if (it->is_regular_file()) files[it->path().string()] = it->file_size();
  }
  return files;
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

TEST(InstanceDirsTest, ASecondDaemonOnTheSameDirectoriesOrSocketIsRefused) {
  testing::DaemonProcess first({"--keep-memory", "2"});
  ASSERT_TRUE(first.Start()) << first.log();
  Rank r(first.socket(), "one", 0, 1, 1 << 16);
  ASSERT_TRUE(r.ckpt);
  absl::Status saved = SaveAll({&r}, 1, proto::TIER_LOCAL_DISK);
  ASSERT_TRUE(saved.ok()) << saved << "\n" << first.log();
  const auto staged = FilesUnder(first.staging_dir());
  ASSERT_FALSE(staged.empty());
  const std::string pid = absl::StrCat("(pid ", first.pid());

  testing::DaemonProcess same_staging;
  same_staging.UseStagingDir(first.staging_dir());
  EXPECT_FALSE(same_staging.Start());
  EXPECT_THAT(same_staging.log(),
              HasSubstr(absl::StrCat("staging directory ", first.staging_dir(),
                                     " is in use by another ckptd ", pid)));
  testing::DaemonProcess same_data;
  same_data.UseDataDir(first.data_dir());
  EXPECT_FALSE(same_data.Start());
  EXPECT_THAT(same_data.log(),
              HasSubstr(absl::StrCat("data directory ", first.data_dir(),
                                     " is in use by another ckptd ", pid)));
  // The first one answers on that socket, so Start sees it accept: the
  // second one must exit by itself.
  testing::DaemonProcess same_socket;
  same_socket.UseSocket(first.socket());
  same_socket.Start();
  ASSERT_TRUE(same_socket.WaitExit(30)) << same_socket.log();
  EXPECT_THAT(same_socket.log(),
              HasSubstr(absl::StrCat("socket ", first.socket(),
                                     " is in use by another ckptd ", pid)));

  // The first one lost nothing: its slots are there, it still serves, and
  // step 1 restores from its memory tier.
  EXPECT_EQ(FilesUnder(first.staging_dir()), staged);
  ASSERT_TRUE(first.Accepting());
  r.Fill(99);
  absl::Status restored = r.ckpt->Restore(1);
  ASSERT_TRUE(restored.ok()) << restored << "\n" << first.log();
  EXPECT_TRUE(r.Matches(1));

  // What it made is its uid's alone.
  EXPECT_EQ(ModeOf(first.data_dir()), 0700u);
  EXPECT_EQ(ModeOf(first.staging_dir()), 0700u);
  for (const auto& [path, size] : FilesUnder(first.data_dir() + "/shards")) {
    EXPECT_EQ(ModeOf(path) & 077, 0u) << path;
  }

  // A SIGKILLed daemon leaves no lock behind: the next one starts.
  first.Kill();
  ASSERT_TRUE(same_staging.Start()) << same_staging.log();
}

TEST(InstanceDirsTest, AStagingDirectoryThatIsASymlinkOrAnotherUsersIsRefused) {
  testing::TempDir dir;
  const std::string target = dir.File("real");
  std::filesystem::create_directories(target);
  const std::string link = dir.File("link");
  std::filesystem::create_directory_symlink(target, link);
  testing::DaemonProcess via_link;
  via_link.UseStagingDir(link);
  EXPECT_FALSE(via_link.Start());
  EXPECT_THAT(via_link.log(), HasSubstr(absl::StrCat("staging directory ", link,
                                                     " is a symlink")));
  EXPECT_TRUE(std::filesystem::is_empty(target));

  if (::geteuid() != 0) {
    GTEST_SKIP() << "making a directory of another user needs root";
  }
  const std::string theirs = dir.File("theirs");
  std::filesystem::create_directories(theirs);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  testing::DaemonProcess foreign;
  foreign.UseStagingDir(theirs);
  EXPECT_FALSE(foreign.Start());
  EXPECT_THAT(foreign.log(),
              HasSubstr(absl::StrCat("staging directory ", theirs,
                                     " is owned by uid 65534")));
}

}  // namespace
}  // namespace ckpt::client
