// The adaptive codec: the governor's dithered choices follow its effort, its
// signals move the effort within bounds, and a writer under it compresses
// everything for a slow disk and stops making a fast one wait for the
// compressor, with every chunk reading back bit-exact either way.
#include "snapshot/codec_governor.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "gtest/gtest.h"
#include "io/fault_injection_fs.h"
#include "io/file_system.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

TEST(CodecGovernorTest, ChoicesFollowTheEffort) {
  CodecGovernor part({.initial_effort = 0.3});
  int compressed = 0;
  for (int i = 0; i < 1000; ++i) {
    CodecChoice c = part.Choose();
    if (c.compress) {
      ++compressed;
      EXPECT_EQ(c.level, 1);
    }
  }
  EXPECT_NEAR(compressed, 300, 1);
  EXPECT_EQ(part.stats().compressed, static_cast<uint64_t>(compressed));
  EXPECT_EQ(part.stats().stored_raw, static_cast<uint64_t>(1000 - compressed));

  CodecGovernor harder(
      {.base_level = 1, .max_effort = 3.0, .initial_effort = 2.25});
  std::map<int, int> levels;
  for (int i = 0; i < 1000; ++i) {
    CodecChoice c = harder.Choose();
    ASSERT_TRUE(c.compress);
    ++levels[c.level];
  }
  EXPECT_EQ(levels.size(), 2u);
  EXPECT_NEAR(levels[2], 750, 1);
  EXPECT_NEAR(levels[3], 250, 1);
}

TEST(CodecGovernorTest, SignalsMoveTheEffortWithinItsBounds) {
  CodecGovernor g({.max_effort = 2.0, .step_up = 0.25, .step_down = 0.5});
  EXPECT_DOUBLE_EQ(g.stats().effort, 1.0);
  g.Observe(CodecGovernor::Signal::kDiskBusy);
  EXPECT_DOUBLE_EQ(g.stats().effort, 1.0);
  for (int i = 0; i < 3; ++i) g.Observe(CodecGovernor::Signal::kDiskStarved);
  EXPECT_DOUBLE_EQ(g.stats().effort, 0.0);
  for (int i = 0; i < 10; ++i) g.Observe(CodecGovernor::Signal::kAhead);
  EXPECT_DOUBLE_EQ(g.stats().effort, 2.0);
  EXPECT_EQ(g.stats().starved, 3u);
  EXPECT_EQ(g.stats().observations, 14u);
  // Starved: fewer queued bytes than the threshold.
  EXPECT_EQ(g.Waiting(0), CodecGovernor::Signal::kDiskStarved);
  EXPECT_EQ(g.Waiting(g.options().starved_below_bytes),
            CodecGovernor::Signal::kDiskBusy);
}

// Float32 weights drawn from a normal distribution: their exponent bytes
// compress, their mantissas do not; byte-shuffle + zstd stores them in about
// four fifths of their size.
std::vector<uint8_t> Weights(std::mt19937_64& rng, size_t count) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint8_t> bytes(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) {
    float v = normal(rng);
    std::memcpy(bytes.data() + i * sizeof(float), &v, sizeof(float));
  }
  return bytes;
}

class WriterUnderGovernorTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kChunk = 256 << 10;

  // Writes `data` as one float32 tensor through `fs` under `governor`, reads it
  // back and compares; returns what became of the chunks.
  ShardWriteStats WriteAndCheck(io::FileSystem* fs, const std::string& path,
                                const std::vector<uint8_t>& data,
                                std::shared_ptr<CodecGovernor> governor) {
    ShardWriterOptions options;
    options.chunk_size = kChunk;
    options.governor = std::move(governor);
    ShardWriter writer(fs, path, {"job", 1, 0, 1}, options);
    const int64_t n = static_cast<int64_t>(data.size() / sizeof(float));
    EXPECT_TRUE(
        writer.AddTensor({"w", proto::DTYPE_FLOAT32, {n}, {0}, {n}, data})
            .ok());
    absl::StatusOr<proto::ShardManifest> m = writer.Commit();
    EXPECT_TRUE(m.ok()) << m.status();
    auto reader = ShardReader::Open(io::DefaultFileSystem(), path);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (reader.ok()) {
      std::vector<uint8_t> back(data.size());
      EXPECT_TRUE((*reader)->ReadItem("w", absl::MakeSpan(back)).ok());
      EXPECT_TRUE(back == data);
    }
    return writer.stats();
  }

  testing::TempDir dir_;
};

TEST_F(WriterUnderGovernorTest, ASlowDiskGetsItsChunksCompressed) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const std::vector<uint8_t> data = Weights(rng, 24 * kChunk / sizeof(float));
  io::FaultInjectionFs fs(io::DefaultFileSystem());
  fs.DisableDurabilityModel();
  // About 10 ms per compressed chunk: far slower than compressing one.
  fs.SetWriteThroughput(20 << 20);
  auto governor = std::make_shared<CodecGovernor>(CodecGovernorOptions{});
  ShardWriteStats stats =
      WriteAndCheck(&fs, dir_.path() + "/slow.shard", data, governor);
  EXPECT_EQ(stats.compressed + stats.raw_chosen + stats.raw_incompressible,
            24u);
  // The compressor keeps ahead of such a disk: the governor keeps the effort
  // at its maximum (a stalled test machine may cost it a step or two).
  EXPECT_GE(stats.compressed, 20u) << "seed " << seed;
  EXPECT_GE(governor->stats().effort, 0.8) << "seed " << seed;
}

TEST_F(WriterUnderGovernorTest, AFastDiskDoesNotWaitForTheCompressor) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const std::vector<uint8_t> data = Weights(rng, 64 * kChunk / sizeof(float));
  // Writes to tmpfs complete as soon as they are queued, so whenever the
  // writer waits for an encoded chunk the "disk" is idle.
  io::FaultInjectionFs fs(io::DefaultFileSystem());
  fs.DisableDurabilityModel();
  auto governor = std::make_shared<CodecGovernor>(CodecGovernorOptions{});
  ShardWriteStats stats = WriteAndCheck(
      &fs, "/dev/shm/ckpt-governor-" + std::to_string(seed) + ".shard", data,
      governor);
  (void)io::DefaultFileSystem()->Unlink("/dev/shm/ckpt-governor-" +
                                        std::to_string(seed) + ".shard");
  EXPECT_GT(governor->stats().starved, 0u) << "seed " << seed;
  EXPECT_GT(stats.raw_chosen, 0u) << "seed " << seed;
  EXPECT_EQ(stats.compressed + stats.raw_chosen + stats.raw_incompressible,
            64u);
}

TEST_F(WriterUnderGovernorTest, NoGovernorCompressesEveryChunkThatPays) {
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<uint8_t> data = Weights(rng, 8 * kChunk / sizeof(float));
  ShardWriteStats stats = WriteAndCheck(
      io::DefaultFileSystem(), dir_.path() + "/plain.shard", data, nullptr);
  EXPECT_EQ(stats.compressed, 8u);
  EXPECT_EQ(stats.raw_chosen, 0u);
}

}  // namespace
}  // namespace ckpt::snapshot
