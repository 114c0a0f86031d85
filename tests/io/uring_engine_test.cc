// The io_uring engine under injected faults: short completions and -EAGAIN must
// still produce byte-exact files (writes) and buffers (reads); an injected
// errno surfaces with file and offset.
#include "io/uring_engine.h"

#include <cerrno>
#include <cstring>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/errno_status.h"
#include "io/file_system.h"
#include "tests/test_util.h"

namespace ckpt::io {
namespace {

using ::testing::HasSubstr;

class UringFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!IoUringAvailable())
      GTEST_SKIP() << "io_uring is not available in this kernel/sandbox";
  }

  // A file system whose every io_uring submission goes through `hook`.
  std::unique_ptr<FileSystem> FsWithHook(UringFaultHook hook) {
    PosixFsOptions options;
    options.queue_depth = 4;
    options.max_request_bytes = 256 << 10;
    options.uring_fault_hook = std::move(hook);
    return NewPosixFileSystem(options);
  }

  testing::TempDir dir_;
};

// Short completions (aligned, as O_DIRECT needs) and EAGAIN on a random mix of
// submissions.
UringFaultHook RandomShortAndEagain(uint64_t seed, int* shorts, int* eagains) {
  auto rng = std::make_shared<std::mt19937_64>(seed);
  return [rng, shorts, eagains](const UringRequestInfo& info) {
    UringFault f;
    switch ((*rng)() % 4) {
      case 0:
        if (info.length > 4096) {
          f.kind = UringFault::kShort;
          f.short_length = 4096 * (1 + (*rng)() % (info.length / 4096 - 1 + 1));
          if (f.short_length >= info.length) f.short_length = 4096;
          ++*shorts;
        }
        break;
      case 1:
        f.kind = UringFault::kErrno;
        f.err = ((*rng)() % 2) ? EAGAIN : EINTR;
        ++*eagains;
        break;
      default:
        break;
    }
    return f;
  };
}

TEST_F(UringFaultTest, ShortWritesAndEagainProduceByteExactFiles) {
  uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  int shorts = 0, eagains = 0;
  auto fs = FsWithHook(RandomShortAndEagain(seed, &shorts, &eagains));
  const size_t size = (5 << 20) + 3 * 4096;
  std::vector<uint8_t> expected = testing::RandomBytes(rng, size);
  const std::string path = dir_.File("data");
  {
    auto file = fs->NewWritableFile(path, {.direct = true});
    ASSERT_TRUE(file.ok()) << file.status();
    // Writes of assorted aligned sizes.
    size_t pos = 0;
    while (pos < size) {
      size_t len = std::min<size_t>(size - pos, 4096 * (1 + rng() % 300));
      AlignedBuffer b(len);
      std::memcpy(b.data(), expected.data() + pos, len);
      ASSERT_TRUE((*file)->Write(pos, std::move(b)).ok());
      pos += len;
    }
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  EXPECT_GT(shorts, 0);
  EXPECT_GT(eagains, 0);
  std::string actual = testing::ReadAll(path);
  ASSERT_EQ(actual.size(), size);
  EXPECT_EQ(std::memcmp(actual.data(), expected.data(), size), 0);
}

TEST_F(UringFaultTest, ShortReadsAndEagainFillBuffersExactly) {
  uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const size_t size = 3 << 20;
  std::vector<uint8_t> expected = testing::RandomBytes(rng, size);
  const std::string path = dir_.File("data");
  testing::WriteAll(path, std::string(expected.begin(), expected.end()));
  int shorts = 0, eagains = 0;
  auto fs = FsWithHook(RandomShortAndEagain(seed + 1, &shorts, &eagains));
  auto file = fs->NewReadableFile(path, {.direct = true});
  ASSERT_TRUE(file.ok());
  AlignedBuffer a(size - 8192), b(8192);
  ASSERT_TRUE((*file)->ReadQueued(0, a.span()).ok());
  ASSERT_TRUE((*file)->ReadQueued(size - 8192, b.span()).ok());
  ASSERT_TRUE((*file)->WaitReads().ok());
  EXPECT_GT(shorts + eagains, 0);
  EXPECT_EQ(std::memcmp(a.data(), expected.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(b.data(), expected.data() + size - 8192, 8192), 0);
}

TEST_F(UringFaultTest, InjectedErrnoFailsTheFileWithPathAndOffset) {
  int calls = 0;
  auto fs = FsWithHook([&calls](const UringRequestInfo& info) {
    UringFault f;
    if (++calls == 3) {
      f.kind = UringFault::kErrno;
      f.err = ENOSPC;
    }
    return f;
  });
  const std::string path = dir_.File("full");
  auto file = fs->NewWritableFile(path, {.direct = true});
  ASSERT_TRUE(file.ok());
  absl::Status s;
  for (int i = 0; i < 8 && s.ok(); ++i)
    s = (*file)->Write(i * 65536ull, AlignedBuffer(65536));
  if (s.ok()) s = (*file)->Flush();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(StatusErrno(s), ENOSPC);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("offset 131072"));
  // The first error sticks: a later call cannot pretend the file is fine.
  EXPECT_FALSE((*file)->Sync().ok());
}

TEST_F(UringFaultTest, EngineRejectsBadQueueDepth) {
  EXPECT_EQ(UringEngine::Create({.queue_depth = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt::io
