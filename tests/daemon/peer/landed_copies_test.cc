// LandedCopies (daemon/peer/landed_copies.h): copies of a store's shards
// landed bit-exact, held to a budget by removing the least recently used,
// landed once when several ask at once, forgotten with their steps, and
// emptied at start; landed on demand, only the ranges asked for, each read
// from the store once, a failed read named and done again by the next ask.
// The store here is a directory (any io::FileSystem).
#include "daemon/peer/landed_copies.h"

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "io/file_system_wrapper.h"
#include "io/sync_readable_file.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

class LandedCopiesTest : public ::testing::Test {
 protected:
  LandedCopiesTest() { EXPECT_TRUE(fs_->CreateDirs(store_.path()).ok()); }
  // Rank 0's copy of `step` in the store: 200000 bytes made of the step, that
  // do not compress.
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
    std::mt19937 bytes(static_cast<uint32_t>(step));
    for (uint8_t& b : data) b = static_cast<uint8_t>(bytes());
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
  EXPECT_EQ(landed.fetched_bytes(), one) << "every byte read once";
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

TEST_F(LandedCopiesTest, OnDemandOnlyTheRangesAskedForAreReadEachOnce) {
  const uint64_t size = *fs_->FileSize(Stored(7));
  LandedCopies landed(fs_, memory_.File("landing"), uint64_t{1} << 30);
  absl::StatusOr<std::string> path =
      landed.Land(fs_, store_.File(snapshot::ShardFileName(7, 0, ".ckpt")), "j",
                  7, 0, LandedCopies::How::kOnDemand);
  ASSERT_TRUE(path.ok()) << path.status();
  // The footer and manifest are there: the file describes itself.
  const uint64_t described = landed.fetched_bytes();
  EXPECT_GT(described, 0u);
  EXPECT_LT(described, size / 2);
  EXPECT_TRUE(snapshot::ShardReader::Open(fs_, *path).ok());
  EXPECT_EQ(landed.held_bytes(), size) << "counted whole from its start";
  // Four readers ask for the same range at once: it is read once.
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      absl::Status s = landed.LandRange(*path, "j", 7, 0, 4096, 8192);
      EXPECT_TRUE(s.ok()) << s;
    });
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(landed.fetched_bytes(), described + 8192);
  ASSERT_TRUE(landed.LandRange(*path, "j", 7, 0, 0, size).ok());
  EXPECT_EQ(landed.fetched_bytes(), size) << "no byte read twice";
  EXPECT_TRUE(Holds(*path, 7));
  // Asked for whole now, it is a hit.
  EXPECT_EQ(Land(landed, 7), *path);
  EXPECT_EQ(landed.fetched_bytes(), size);
  // Another shard's name, or bytes past the end, are refused.
  absl::Status other = landed.LandRange(*path, "j", 8, 0, 0, 1);
  EXPECT_TRUE(absl::IsNotFound(other)) << other;
  EXPECT_THAT(std::string(other.message()), ::testing::HasSubstr("step 8"));
  absl::Status past = landed.LandRange(*path, "j", 7, 0, size - 1, 2);
  EXPECT_TRUE(absl::IsOutOfRange(past)) << past;
}

// A store whose reads fail while `failing` is set.
class FlakyStore final : public io::FileSystemWrapper {
 public:
  explicit FlakyStore(io::FileSystem* base) : FileSystemWrapper(base) {}
  std::atomic<bool> failing{false};

  absl::StatusOr<std::unique_ptr<io::ReadableFile>> NewReadableFile(
      const std::string& path, const io::FileOptions& options) override {
    auto file = FileSystemWrapper::NewReadableFile(path, options);
    if (!file.ok()) return file.status();
    return std::unique_ptr<io::ReadableFile>(
        new File(*std::move(file), &failing));
  }

 private:
  class File final : public io::SyncReadableFile {
   public:
    File(std::unique_ptr<io::ReadableFile> file, std::atomic<bool>* failing)
        : file_(std::move(file)), failing_(failing) {}
    absl::Status Read(uint64_t offset, absl::Span<uint8_t> dst) override {
      if (*failing_) return absl::UnavailableError("HTTP 503 from the store");
      return file_->Read(offset, dst);
    }
    absl::StatusOr<uint64_t> Size() override { return file_->Size(); }
    const std::string& path() const override { return file_->path(); }

   private:
    std::unique_ptr<io::ReadableFile> file_;
    std::atomic<bool>* failing_;
  };
};

TEST_F(LandedCopiesTest, AFailedStoreReadIsNamedAndTheNextAskLandsIt) {
  const uint64_t size = *fs_->FileSize(Stored(8));
  FlakyStore store(fs_);
  LandedCopies landed(fs_, memory_.File("landing"), uint64_t{1} << 30);
  absl::StatusOr<std::string> path =
      landed.Land(&store, store_.File(snapshot::ShardFileName(8, 0, ".ckpt")),
                  "j", 8, 0, LandedCopies::How::kOnDemand);
  ASSERT_TRUE(path.ok()) << path.status();
  store.failing = true;
  absl::Status failed = landed.LandRange(*path, "j", 8, 0, 0, size);
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(std::string(failed.message()),
              ::testing::AllOf(::testing::HasSubstr("job j step 8 rank 0"),
                               ::testing::HasSubstr("HTTP 503")));
  store.failing = false;
  ASSERT_TRUE(landed.LandRange(*path, "j", 8, 0, 0, size).ok());
  EXPECT_TRUE(Holds(*path, 8));
}

}  // namespace
}  // namespace ckpt::daemon
