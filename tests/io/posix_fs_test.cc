#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/errno_status.h"
#include "io/file_system.h"
#include "tests/test_util.h"

namespace ckpt::io {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

AlignedBuffer Filled(size_t n, uint8_t seed) {
  AlignedBuffer b(n);
  for (size_t i = 0; i < n; ++i)
    b.data()[i] = static_cast<uint8_t>(seed + i * 7);
  return b;
}

class PosixFsTest : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<FileSystem> fs_ =
      NewPosixFileSystem(PosixFsOptions{.use_io_uring = GetParam()});
  testing::TempDir dir_;
};

TEST_P(PosixFsTest, DirectWritesAndQueuedReadsRoundTrip) {
  const std::string path = dir_.File("data");
  {
    auto file = fs_->NewWritableFile(path, {.direct = true});
    ASSERT_TRUE(file.ok()) << file.status();
    // Several requests per write (3 MiB + 4 KiB with 1 MiB requests), out of
    // order offsets.
    ASSERT_TRUE((*file)->Write(3 << 20, Filled(4096, 9)).ok());
    ASSERT_TRUE((*file)->Write(0, Filled(3 << 20, 1)).ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  auto size = fs_->FileSize(path);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, (3u << 20) + 4096);

  auto file = fs_->NewReadableFile(path, {.direct = true});
  ASSERT_TRUE(file.ok()) << file.status();
  AlignedBuffer a(3 << 20), b(4096);
  ASSERT_TRUE((*file)->ReadQueued(0, a.span()).ok());
  ASSERT_TRUE((*file)->ReadQueued(3 << 20, b.span()).ok());
  ASSERT_TRUE((*file)->WaitReads().ok());
  AlignedBuffer ea = Filled(3 << 20, 1), eb = Filled(4096, 9);
  EXPECT_EQ(std::memcmp(a.data(), ea.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(b.data(), eb.data(), b.size()), 0);
}

TEST_P(PosixFsTest, BorrowedBytesAreWrittenFromWhereTheyLie) {
  const std::string path = dir_.File("borrowed");
  AlignedBuffer mine = Filled(2 << 20, 5);
  {
    auto file = fs_->NewWritableFile(path, {.direct = true});
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->Write(0, Filled(4096, 3)).ok());
    ASSERT_TRUE((*file)->WriteBorrowed(4096, mine.span()).ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  const std::string back = testing::ReadAll(path);
  ASSERT_EQ(back.size(), 4096u + mine.size());
  EXPECT_EQ(std::memcmp(back.data() + 4096, mine.data(), mine.size()), 0);
  // O_DIRECT needs an aligned address too; buffered I/O (tmpfs) takes any.
  auto file = fs_->NewWritableFile(dir_.File("y"), {.direct = true});
  ASSERT_TRUE(file.ok());
  absl::Status s = (*file)->WriteBorrowed(0, mine.span().subspan(8, 4096));
  if (!s.ok()) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("not aligned"));
  }
}

TEST_P(PosixFsTest, UnalignedDirectWriteIsRefusedWithItsOffset) {
  auto file = fs_->NewWritableFile(dir_.File("x"), {.direct = true});
  ASSERT_TRUE(file.ok());
  absl::Status s = (*file)->Write(100, Filled(4096, 0));
  // tmpfs has no O_DIRECT; then buffered I/O accepts any offset.
  if (!s.ok()) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("offset 100"));
  }
}

TEST_P(PosixFsTest, ReadPastEndIsOutOfRangeAndNamesTheFile) {
  const std::string path = dir_.File("short");
  ASSERT_TRUE(WriteStringToFile(fs_.get(), path, "hello").ok());
  auto file = fs_->NewReadableFile(path, {});
  ASSERT_TRUE(file.ok());
  uint8_t buf[16];
  absl::Status s = (*file)->Read(0, absl::MakeSpan(buf));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr(path));
  ASSERT_TRUE((*file)->ReadQueued(2, absl::MakeSpan(buf)).ok());
  EXPECT_EQ((*file)->WaitReads().code(), absl::StatusCode::kOutOfRange);
}

TEST_P(PosixFsTest, MetadataOperations) {
  ASSERT_TRUE(fs_->CreateDirs(dir_.File("a/b/c")).ok());
  ASSERT_TRUE(fs_->CreateDirs(dir_.File("a/b/c")).ok()) << "existing is fine";
  ASSERT_TRUE(WriteStringToFile(fs_.get(), dir_.File("a/one"), "1").ok());
  ASSERT_TRUE(fs_->Rename(dir_.File("a/one"), dir_.File("a/two")).ok());
  ASSERT_TRUE(fs_->SyncDir(dir_.File("a")).ok());
  auto names = fs_->ListDir(dir_.File("a"));
  ASSERT_TRUE(names.ok());
  EXPECT_THAT(*names, ElementsAre("b", "two"));
  EXPECT_TRUE(*fs_->Exists(dir_.File("a/two")));
  EXPECT_FALSE(*fs_->Exists(dir_.File("a/one")));
  ASSERT_TRUE(fs_->Unlink(dir_.File("a/two")).ok());
  absl::Status missing = fs_->Unlink(dir_.File("a/two"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("a/two"));
  EXPECT_EQ(StatusErrno(missing), ENOENT);
  auto free_space = fs_->FreeSpace(dir_.path());
  ASSERT_TRUE(free_space.ok());
  EXPECT_GT(*free_space, 0u);
  EXPECT_EQ(fs_->NewReadableFile(dir_.File("nope"), {}).status().code(),
            absl::StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Engines, PosixFsTest, ::testing::Values(true, false),
                         [](const auto& info) {
                           return info.param ? "io_uring" : "pwrite";
                         });

// A file created sparse (reserve off) takes no memory until a range of it
// is reserved, and then exactly that range is written through the mapping.
TEST(MappedFileTest, ASparseFileReservesTheRangesItIsWrittenIn) {
  testing::TempDir dir;
  FileSystem* fs = DefaultFileSystem();
  const std::string path = dir.File("sparse");
  constexpr uint64_t kSize = 64 << 20;
  auto file = fs->MapFile(path, {.create_size = kSize, .reserve = false});
  ASSERT_TRUE(file.ok()) << file.status();
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kSize);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{1} << 20);
  ASSERT_TRUE((*file)->Reserve(5 << 20, 3 << 20).ok());
  std::memset((*file)->data() + (5 << 20), 0xab, 3 << 20);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{3} << 20);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, uint64_t{8} << 20);
  absl::Status past = (*file)->Reserve(kSize - 1, 2);
  EXPECT_TRUE(absl::IsOutOfRange(past)) << past;
  EXPECT_THAT(std::string(past.message()), ::testing::HasSubstr(path));
}

TEST(PathTest, DirNameBaseNameJoin) {
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("c"), ".");
  EXPECT_EQ(DirName("/c"), "/");
  EXPECT_EQ(DirName("/a/b/"), "/a");
  EXPECT_EQ(BaseName("a/b/c"), "c");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
}

TEST(ErrnoStatusTest, MapsCodesAndKeepsErrno) {
  absl::Status s = ErrnoToStatus(ENOSPC, "write /x at offset 4096");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("write /x at offset 4096"));
  EXPECT_EQ(StatusErrno(s), ENOSPC);
  EXPECT_EQ(ErrnoToStatus(EIO, "x").code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(ErrnoToStatus(0, "x").ok());
  EXPECT_FALSE(StatusErrno(absl::InternalError("plain")).has_value());
}

}  // namespace
}  // namespace ckpt::io
