#include "daemon/persist/file_recycler.h"

#include <atomic>
#include <filesystem>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

class FileRecyclerTest : public ::testing::Test {
 protected:
  std::string Make(const std::string& name, size_t bytes) {
    const std::string path = dir_.File(name);
    testing::WriteAll(path, std::string(bytes, 'x'));
    return path;
  }
  std::unique_ptr<FileRecycler> Open(size_t max_files) {
    auto r = FileRecycler::Open(io::DefaultFileSystem(), dir_.File("recycle"),
                                max_files);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
  bool Exists(const std::string& path) {
    return *io::DefaultFileSystem()->Exists(path);
  }
  testing::TempDir dir_;
};

TEST_F(FileRecyclerTest, KeepsUpToItsLimitAndHandsOutTheBestFit) {
  auto recycler = Open(2);
  const std::string a = Make("a", 1000), b = Make("b", 5000),
                    c = Make("c", 2000);
  recycler->Retire(a);
  recycler->Retire(b);
  // Over the limit: the newest stays, the size least like it (b) goes.
  recycler->Retire(c);
  EXPECT_FALSE(Exists(a) || Exists(b) || Exists(c)) << "moved away";
  EXPECT_EQ(recycler->files(), 2u);
  EXPECT_EQ(recycler->bytes(), 3000u);
  // The closest size.
  const std::string fit = recycler->Take(1800);
  EXPECT_EQ(*io::DefaultFileSystem()->FileSize(fit), 2000u);
  const std::string last = recycler->Take(1);
  EXPECT_EQ(*io::DefaultFileSystem()->FileSize(last), 1000u);
  EXPECT_EQ(recycler->Take(1), "");
  EXPECT_EQ(recycler->bytes(), 0u);
  EXPECT_TRUE(Exists(fit) && Exists(last)) << "the taker's now";
}

// Writing a small shard over a much larger file would free most of its blocks
// when the shard is truncated to its size: such a file is not handed out.
TEST_F(FileRecyclerTest, AFileFarLargerThanTheShardIsNotHandedOut) {
  auto recycler = Open(2);
  const std::string big = dir_.File("big");
  testing::WriteAll(big, "");
  std::filesystem::resize_file(big, 1ull << 30);  // sparse
  recycler->Retire(big);
  EXPECT_EQ(recycler->Take(100 << 20), "");
  const std::string taken = recycler->Take(400 << 20);
  ASSERT_FALSE(taken.empty());
  // Deleted a step at a time, it goes all the same.
  recycler->Retire(taken);
  recycler->Clear();
  auto left = io::DefaultFileSystem()->ListDir(dir_.File("recycle"));
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
}

TEST_F(FileRecyclerTest, ARestartKeepsWhatFitsAndClearDeletesAll) {
  {
    auto recycler = Open(3);
    recycler->Retire(Make("a", 10));
    recycler->Retire(Make("b", 20));
    recycler->Retire(Make("c", 30));
  }
  testing::WriteAll(dir_.File("recycle/stray"), "not ours");
  auto recycler = Open(2);
  EXPECT_EQ(recycler->files(), 2u);
  auto left = io::DefaultFileSystem()->ListDir(dir_.File("recycle"));
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->size(), 2u) << "the third and the stray file were deleted";
  recycler->Clear();
  EXPECT_EQ(recycler->files(), 0u);
  left = io::DefaultFileSystem()->ListDir(dir_.File("recycle"));
  EXPECT_TRUE(left->empty());
  // Off: retired files are deleted at once.
  auto off = Open(0);
  const std::string d = Make("d", 5);
  off->Retire(d);
  off->Clear();  // waits for the deletion in the background
  EXPECT_FALSE(Exists(d));
  EXPECT_EQ(off->files(), 0u);
}

// A shard a reader opened before it was retired is not written over while the
// reader holds it; and a reader that opens a retired shard's old name finds
// nothing.
TEST_F(FileRecyclerTest, AFileAReaderHoldsIsNotHandedOut) {
  auto recycler = Open(2);
  const std::string shard = Make("shard", 4096);
  auto reader = io::DefaultFileSystem()->NewReadableFile(shard, {});
  ASSERT_TRUE(reader.ok()) << reader.status();
  recycler->Retire(shard);
  EXPECT_EQ(io::DefaultFileSystem()->NewReadableFile(shard, {}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(recycler->Take(4096), "") << "still being read";
  reader->reset();
  EXPECT_NE(recycler->Take(4096), "") << "the reader is done";
}

// A deletion waits while persists write, a step at a time, and goes on when
// they pause.
TEST_F(FileRecyclerTest, DeletingWaitsWhileBusy) {
  std::atomic<bool> busy{true};
  auto opened =
      FileRecycler::Open(io::DefaultFileSystem(), dir_.File("recycle"), 1,
                         [&busy] { return busy.load(); });
  ASSERT_TRUE(opened.ok());
  auto& recycler = *opened;
  const std::string big = dir_.File("big");
  testing::WriteAll(big, "");
  std::filesystem::resize_file(big, 600ull << 20);  // sparse: 3 steps
  recycler->Retire(big);
  recycler->Retire(Make("small", 10));  // the big one is evicted
  absl::SleepFor(absl::Milliseconds(300));
  auto left = io::DefaultFileSystem()->ListDir(dir_.File("recycle"));
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->size(), 2u) << "still being deleted";
  busy = false;
  for (int i = 0; i < 500 && left->size() > 1; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    left = io::DefaultFileSystem()->ListDir(dir_.File("recycle"));
  }
  EXPECT_EQ(left->size(), 1u);
  EXPECT_EQ(recycler->files(), 1u);
}

}  // namespace
}  // namespace ckpt::daemon
