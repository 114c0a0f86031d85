// ckptd --shard-format: while some node still runs a ckptd that reads only
// format 3, upgraded nodes write format 3 too; restarted with the default they
// write the newest format (byte-plane coded chunks, XOR deltas), and what they
// wrote before still restores.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "client/checkpointer.h"
#include "gtest/gtest.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"
#include "tests/client/daemon_process.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;

// The shard file's format and how many of its chunks are coded by planes.
void Inspect(const std::string& path, uint32_t* version, int* planes) {
  auto reader = snapshot::ShardReader::Open(io::DefaultFileSystem(), path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->VerifyAll().empty()) << path;
  *version = (*reader)->manifest().format_version();
  *planes = 0;
  for (const proto::Item& item : (*reader)->manifest().items()) {
    for (const proto::ChunkInfo& c : item.chunks())
      *planes += c.codec() == proto::CODEC_ZSTD_PLANES;
  }
}

TEST(ShardFormatTest, FormatThreeUntilEveryNodeReadsFourThenFour) {
  testing::DaemonProcess daemon(
      {"--shard-format", "3", "--keep-disk", "4", "--codec", "zstd"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const int64_t n = 1 << 20;  // 4 MiB of float32: one chunk
  std::vector<float> w(n), saved[2];
  auto connect = [&] {
    auto c = Checkpointer::Connect({"fmt", 0, 1, daemon.socket()});
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) {
      EXPECT_TRUE((*c)->RegisterTensor("w", proto::DTYPE_FLOAT32, w.data(), {n},
                                       {0}, {n})
                      .ok());
    }
    return c.ok() ? *std::move(c) : nullptr;
  };
  auto save = [&](Checkpointer& c, uint64_t step) {
    for (int64_t i = 0; i < n; ++i)
      w[i] = 0.02f * std::sin(0.001f * static_cast<float>(i * step));
    saved[step - 1] = w;
    auto handle = c.SaveAsync(step);
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE((*handle)->WaitCommitted(kDisk).ok());
  };
  uint32_t version = 0;
  int planes = 0;
  {
    std::unique_ptr<Checkpointer> c = connect();
    ASSERT_NE(c, nullptr);
    ASSERT_NO_FATAL_FAILURE(save(*c, 1));
    auto shard = c->DescribeShard(1);
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_NO_FATAL_FAILURE(Inspect(shard->shard_path(), &version, &planes));
    EXPECT_EQ(version, 3u);
    EXPECT_EQ(planes, 0);
  }
  // The upgrade: the same node restarted with the default format.
  daemon.Kill();
  daemon.set_extra_args({"--keep-disk", "4", "--codec", "zstd"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  std::unique_ptr<Checkpointer> c = connect();
  ASSERT_NE(c, nullptr);
  ASSERT_NO_FATAL_FAILURE(save(*c, 2));
  auto shard = c->DescribeShard(2);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_NO_FATAL_FAILURE(Inspect(shard->shard_path(), &version, &planes));
  EXPECT_EQ(version, snapshot::kFormatVersion);
  EXPECT_GT(planes, 0);
  for (uint64_t step : {1, 2}) {
    std::fill(w.begin(), w.end(), -1.0f);
    absl::Status s = c->Restore(step);
    ASSERT_TRUE(s.ok()) << s << " step " << step;
    EXPECT_EQ(w, saved[step - 1]) << "step " << step;
  }
}

}  // namespace
}  // namespace ckpt::client
