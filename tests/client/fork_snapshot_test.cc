// Fork snapshots: the mappings a fork can capture, a child writing what memory
// held at the fork while the parent changes it, and the Checkpointer saving
// through a fork (and falling back to a copy where a fork would not capture the
// memory).
#include "client/fork_snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

using ::testing::HasSubstr;

std::string Mapping(uintptr_t start, uintptr_t end, const char* perms,
                    uint64_t rss_kb, uint64_t huge_kb, const char* flags) {
  return absl::StrCat(absl::Hex(start), "-", absl::Hex(end), " ", perms,
                      " 00000000 00:00 0 \nSize: ", (end - start) >> 10,
                      " kB\nRss: ", rss_kb, " kB\nAnonHugePages: ", huge_kb,
                      " kB\nVmFlags: ", flags, "\n");
}

const void* At(uintptr_t a) { return reinterpret_cast<const void*>(a); }

TEST(ForkSnapshotTest, ParsesWhatAForkCanCapture) {
  // Two adjacent private mappings, half and fully in huge pages, then a gap,
  // a shared one and a do-not-fork one.
  const std::string smaps =
      Mapping(0x100000, 0x500000, "rw-p", 4096, 2048, "rd wr mr mw me ac") +
      Mapping(0x500000, 0x900000, "rw-p", 4096, 4096, "rd wr mr mw me ac") +
      Mapping(0xa00000, 0xb00000, "rw-s", 1024, 0, "rd wr sh mr mw me") +
      Mapping(0xb00000, 0xc00000, "rw-p", 1024, 0, "rd wr mr mw me dc");
  ForkInspection both = ParseSmaps(
      smaps, {{At(0x100000), 0x400000, 0}, {At(0x500000), 0x400000}});
  EXPECT_EQ(both.unsafe, "");
  EXPECT_DOUBLE_EQ(both.huge_page_share, 0.75);
  // A region spanning both private mappings.
  ForkInspection spanning = ParseSmaps(smaps, {{At(0x300000), 0x400000, 0}});
  EXPECT_EQ(spanning.unsafe, "");
  EXPECT_DOUBLE_EQ(spanning.huge_page_share, 0.75);

  EXPECT_THAT(ParseSmaps(smaps, {{At(0x800000), 0x100000 + 1, 0}}).unsafe,
              HasSubstr("0x900000 is not mapped"));
  EXPECT_THAT(ParseSmaps(smaps, {{At(0xa00100), 16, 0}}).unsafe,
              HasSubstr("shared mapping"));
  EXPECT_THAT(ParseSmaps(smaps, {{At(0xb00000), 16, 0}}).unsafe,
              HasSubstr("VmFlags \"dc\""));
  EXPECT_THAT(ParseSmaps(smaps, {{At(0x50), 16, 0}}).unsafe,
              HasSubstr("not mapped"));
}

TEST(ForkSnapshotTest, InspectsThisProcesssMappings) {
  std::vector<uint8_t> heap(8 << 20, 1);
  auto ok = Inspect({{heap.data(), heap.size(), 0}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->unsafe, "");

  const size_t n = 1 << 20;
  void* shared = ::mmap(nullptr, n, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto refused = Inspect({{heap.data(), heap.size(), 0}, {shared, n, 0}});
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_THAT(refused->unsafe, HasSubstr("shared"));
  ::munmap(shared, n);

  void* no_fork = ::mmap(nullptr, n, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(no_fork, MAP_FAILED);
  ASSERT_EQ(::madvise(no_fork, n, MADV_DONTFORK), 0);
  auto dd = Inspect({{no_fork, n, 0}});
  ASSERT_TRUE(dd.ok()) << dd.status();
  EXPECT_THAT(dd->unsafe, HasSubstr("\"dc\"")) << no_fork;
  ::munmap(no_fork, n);
}

std::string ReadAll(int fd, size_t n) {
  std::string out(n, '\0');
  EXPECT_EQ(::pread(fd, out.data(), n, 0), static_cast<ssize_t>(n));
  return out;
}

TEST(ForkSnapshotTest, TheChildWritesMemoryAsItWasAtTheFork) {
  testing::TempDir dir;
  const int fd = ::open(dir.File("slot").c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> a(3 << 20), b(100);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 7);
  const std::vector<uint8_t> a0 = a, b0 = b;
  auto child = ForkedCopy::Start(
      fd, {{a.data(), a.size(), 4096}, {b.data(), b.size(), 0}});
  ASSERT_TRUE(child.ok()) << child.status();
  // The parent goes on at once; the child still writes the old bytes.
  std::fill(a.begin(), a.end(), 0xee);
  std::fill(b.begin(), b.end(), 0xee);
  ASSERT_TRUE((*child)->Wait().ok());
  const std::string file = ReadAll(fd, 4096 + a.size());
  EXPECT_EQ(0, std::memcmp(file.data(), b0.data(), b0.size()));
  EXPECT_EQ(0, std::memcmp(file.data() + 4096, a0.data(), a0.size()));
  ::close(fd);
}

TEST(ForkSnapshotTest, AChildThatCannotWriteSaysWhy) {
  testing::TempDir dir;
  const int created = ::open(dir.File("slot").c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(created, 0);
  ::close(created);
  const int read_only = ::open(dir.File("slot").c_str(), O_RDONLY);
  std::vector<uint8_t> a(4096, 1);
  auto child = ForkedCopy::Start(read_only, {{a.data(), a.size(), 0}});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::Status s = (*child)->Wait();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("snapshot child writing the slot"));
  ::close(read_only);
}

constexpr int64_t kElements = 4 << 20;  // 16 MiB of floats

struct ForkTrainer {
  std::unique_ptr<Checkpointer> ckpt;
  float* w = nullptr;
  void Fill(float v) { std::fill(w, w + kElements, v); }
};

ForkTrainer Connect(const std::string& socket, HostSnapshot mode, float* w) {
  CheckpointerOptions options{"forkjob", 0, 1, socket};
  options.host_snapshot = mode;
  ForkTrainer t;
  auto c = Checkpointer::Connect(options);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return t;
  t.ckpt = *std::move(c);
  t.w = w;
  EXPECT_TRUE(t.ckpt
                  ->RegisterTensor("w", proto::DTYPE_FLOAT32, w, {kElements},
                                   {0}, {kElements})
                  .ok());
  return t;
}

// The state is mutated right after WaitStaged, while the child may still be
// writing; the committed step holds the state as it was at SaveAsync.
TEST(ForkSnapshotTest, ASaveThroughAForkHoldsTheStateOfTheSave) {
  testing::DaemonProcess daemon({"--keep-memory", "3", "--keep-disk", "3"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  std::vector<float> w(kElements);
  ForkTrainer t = Connect(daemon.socket(), HostSnapshot::kFork, w.data());
  ASSERT_TRUE(t.ckpt);
  for (uint64_t step = 1; step <= 3; ++step) {
    t.Fill(static_cast<float>(step));
    auto save = t.ckpt->SaveAsync(step);
    ASSERT_TRUE(save.ok()) << save.status();
    ASSERT_TRUE((*save)->WaitStaged().ok());
    t.Fill(-1);  // the next training step
    absl::Status committed = (*save)->WaitCommitted(proto::TIER_LOCAL_DISK);
    ASSERT_TRUE(committed.ok()) << committed;
  }
  EXPECT_EQ(t.ckpt->stats().saves_forked, 3u);
  EXPECT_EQ(t.ckpt->stats().saves_copied, 0u);
  EXPECT_EQ(t.ckpt->stats().fork_refused, "");
  for (uint64_t step = 1; step <= 3; ++step) {
    t.Fill(0);
    absl::Status restored = t.ckpt->Restore(step);
    ASSERT_TRUE(restored.ok()) << restored;
    EXPECT_EQ(w[0], static_cast<float>(step));
    EXPECT_EQ(w[kElements - 1], static_cast<float>(step));
    EXPECT_EQ(std::count(w.begin(), w.end(), static_cast<float>(step)),
              kElements);
  }
}

TEST(ForkSnapshotTest, MemoryAForkWouldNotCaptureIsCopied) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const size_t bytes = kElements * sizeof(float);
  void* shared = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  ForkTrainer t = Connect(daemon.socket(), HostSnapshot::kFork,
                          static_cast<float*>(shared));
  ASSERT_TRUE(t.ckpt);
  t.Fill(5);
  auto save = t.ckpt->SaveAsync(1);
  ASSERT_TRUE(save.ok()) << save.status();
  ASSERT_TRUE((*save)->WaitStaged().ok());
  t.Fill(-1);
  ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
  EXPECT_EQ(t.ckpt->stats().saves_forked, 0u);
  EXPECT_EQ(t.ckpt->stats().saves_copied, 1u);
  EXPECT_THAT(t.ckpt->stats().fork_refused, HasSubstr("shared mapping"));
  ASSERT_TRUE(t.ckpt->Restore(1).ok());
  EXPECT_EQ(t.w[123], 5.0f);
  ::munmap(shared, bytes);
}

TEST(ForkSnapshotTest, TheEnvironmentChoosesTheSnapshot) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  std::vector<float> w(kElements, 1);
  {
    ForkTrainer t = Connect(daemon.socket(), HostSnapshot::kCopy, w.data());
    ASSERT_TRUE(t.ckpt);
    auto save = t.ckpt->SaveAsync(1);
    ASSERT_TRUE(save.ok() && (*save)->WaitCommitted(proto::TIER_MEMORY).ok());
    EXPECT_EQ(t.ckpt->stats().saves_copied, 1u);
    EXPECT_EQ(t.ckpt->stats().saves_forked, 0u);
  }
  ::setenv("CKPT_HOST_SNAPSHOT", "fork", 1);
  {
    ForkTrainer t = Connect(daemon.socket(), HostSnapshot::kCopy, w.data());
    ASSERT_TRUE(t.ckpt);
    auto save = t.ckpt->SaveAsync(2);
    ASSERT_TRUE(save.ok() && (*save)->WaitCommitted(proto::TIER_MEMORY).ok());
    EXPECT_EQ(t.ckpt->stats().saves_forked, 1u);
  }
  ::setenv("CKPT_HOST_SNAPSHOT", "sometimes", 1);
  auto bad = Checkpointer::Connect({"forkjob", 0, 1, daemon.socket()});
  ::unsetenv("CKPT_HOST_SNAPSHOT");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("CKPT_HOST_SNAPSHOT is \"sometimes\""));
}

}  // namespace
}  // namespace ckpt::client
