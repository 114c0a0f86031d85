#include "daemon/file_recycler.h"

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
  const std::string a = Make("a", 1000), b = Make("b", 3000),
                    c = Make("c", 2000);
  recycler->Retire(a);
  recycler->Retire(b);
  recycler->Retire(c);  // over the limit: deleted
  EXPECT_FALSE(Exists(a) || Exists(b) || Exists(c)) << "moved or deleted";
  EXPECT_EQ(recycler->files(), 2u);
  EXPECT_EQ(recycler->bytes(), 4000u);
  // The smallest at least as large; else the largest.
  const std::string fit = recycler->Take(1500);
  EXPECT_EQ(*io::DefaultFileSystem()->FileSize(fit), 3000u);
  const std::string last = recycler->Take(5000);
  EXPECT_EQ(*io::DefaultFileSystem()->FileSize(last), 1000u);
  EXPECT_EQ(recycler->Take(1), "");
  EXPECT_EQ(recycler->bytes(), 0u);
  EXPECT_TRUE(Exists(fit) && Exists(last)) << "the taker's now";
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
  EXPECT_FALSE(Exists(d));
  EXPECT_EQ(off->files(), 0u);
}

}  // namespace
}  // namespace ckpt::daemon
