// LandedCopies (daemon/peer/landed_copies.h): copies of a store's shards
// landed bit-exact, held to a budget by removing the least recently used,
// landed once when several ask at once, forgotten with their steps, and
// emptied at start. The store here is a directory (any io::FileSystem).
#include "daemon/peer/landed_copies.h"

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

class LandedCopiesTest : public ::testing::Test {
 protected:
  LandedCopiesTest() { EXPECT_TRUE(fs_->CreateDirs(store_.path()).ok()); }
  // Rank 0's copy of `step` in the store: 200000 bytes made of the step.
  std::string Stored(uint64_t step) {
    const std::string path =
        store_.File(snapshot::ShardFileName(step, 0, ".ckpt"));
    snapshot::ShardWriter writer(fs_, path, {"j", step, 0, 1}, {});
    const std::vector<uint8_t> data = Bytes(step);  // read at Commit
    EXPECT_TRUE(writer.AddBytes("state", data).ok());
    EXPECT_TRUE(writer.Commit().ok());
    return path;
  }
  static std::vector<uint8_t> Bytes(uint64_t step) {
    std::vector<uint8_t> data(200000);
    for (size_t i = 0; i < data.size(); ++i)
      data[i] = static_cast<uint8_t>(i * 7 + step);
    return data;
  }
  std::string Land(LandedCopies& landed, uint64_t step) {
    absl::StatusOr<std::string> path =
        landed.Land(fs_, store_.File(snapshot::ShardFileName(step, 0, ".ckpt")),
                    "j", step, 0);
    EXPECT_TRUE(path.ok()) << path.status();
    return path.value_or("");
  }
  bool Exists(const std::string& path) {
    return fs_->Exists(path).value_or(false);
  }
  bool Holds(const std::string& path, uint64_t step) {
    auto reader = snapshot::ShardReader::Open(fs_, path);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return false;
    std::vector<uint8_t> got(200000);
    absl::Status read = (*reader)->ReadItem("state", absl::MakeSpan(got));
    EXPECT_TRUE(read.ok()) << read;
    return read.ok() && got == Bytes(step);
  }

  io::FileSystem* fs_ = io::DefaultFileSystem();
  testing::TempDir store_, memory_;
};

TEST_F(LandedCopiesTest, TheLeastRecentlyUsedGoToMakeRoom) {
  const uint64_t size = *fs_->FileSize(Stored(1));
  Stored(2);
  Stored(3);
  LandedCopies landed(fs_, memory_.File("landing"), 2 * size + size / 2);
  const std::string one = Land(landed, 1), two = Land(landed, 2);
  EXPECT_TRUE(Holds(one, 1));
  EXPECT_TRUE(Holds(two, 2));
  EXPECT_EQ(Land(landed, 1), one);  // a hit: step 1 is used again
  const std::string three = Land(landed, 3);
  EXPECT_TRUE(Holds(three, 3));
  EXPECT_TRUE(Exists(one));
  EXPECT_FALSE(Exists(two)) << "step 2 was used least recently";
  EXPECT_LE(landed.held_bytes(), 2 * size + size / 2);
  // Asked for again, it lands again.
  EXPECT_TRUE(Holds(Land(landed, 2), 2));
  EXPECT_LE(landed.held_bytes(), 2 * size + size / 2);
}

TEST_F(LandedCopiesTest, ACopyAskedForAtOnceLandsOnceAndRetentionForgetsIt) {
  Stored(4);
  Stored(5);
  LandedCopies landed(fs_, memory_.File("landing"), uint64_t{1} << 30);
  std::vector<std::string> paths(4);
  std::vector<std::thread> askers;
  for (int i = 0; i < 4; ++i) {
    askers.emplace_back([&, i] { paths[i] = Land(landed, 4); });
  }
  for (std::thread& t : askers) t.join();
  for (const std::string& p : paths) EXPECT_EQ(p, paths[0]);
  EXPECT_TRUE(Holds(paths[0], 4));
  const uint64_t one = landed.held_bytes();
  EXPECT_EQ(one, *fs_->FileSize(paths[0]));
  const std::string five = Land(landed, 5);
  landed.Forget("j", 5);
  EXPECT_FALSE(Exists(paths[0]));
  EXPECT_TRUE(Exists(five));
  EXPECT_EQ(landed.held_bytes(), one);  // step 5's alone
}

TEST_F(LandedCopiesTest, AStartEmptiesWhatAnEarlierDaemonLanded) {
  Stored(6);
  std::string old;
  {
    LandedCopies landed(fs_, memory_.File("landing"), uint64_t{1} << 30);
    old = Land(landed, 6);
    ASSERT_TRUE(Exists(old));
  }
  LandedCopies again(fs_, memory_.File("landing"), uint64_t{1} << 30);
  EXPECT_FALSE(Exists(old));
  EXPECT_EQ(again.held_bytes(), 0u);
  EXPECT_TRUE(Holds(Land(again, 6), 6));
}

TEST_F(LandedCopiesTest, AMissingCopyIsNamed) {
  LandedCopies landed(fs_, memory_.File("landing"), uint64_t{1} << 30);
  absl::StatusOr<std::string> path = landed.Land(
      fs_, store_.File(snapshot::ShardFileName(9, 0, ".ckpt")), "j", 9, 0);
  ASSERT_FALSE(path.ok());
  EXPECT_THAT(std::string(path.status().message()),
              ::testing::HasSubstr(snapshot::ShardFileName(9, 0, ".ckpt")));
  EXPECT_EQ(landed.held_bytes(), 0u);
}

}  // namespace
}  // namespace ckpt::daemon
