// The adaptive codec: the governor's dithered choices follow its effort, the
// rates its windows measure move the effort within bounds, and a writer under
// it compresses everything for a slow disk and stops making a fast one wait
// for the compressor, with every chunk reading back bit-exact either way.
#include "snapshot/codec_governor.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "io/fault_injection_fs.h"
#include "io/file_system.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

TEST(CodecGovernorTest, ChoicesFollowTheEffort) {
  // One window: no probe among these choices.
  CodecGovernor part({.initial_effort = 0.3, .window_bytes = 1 << 30});
  int compressed = 0;
  for (int i = 0; i < 1000; ++i) {
    CodecChoice c = part.Choose(1000);
    if (c.compress) {
      ++compressed;
      EXPECT_EQ(c.level, 1);
    }
  }
  EXPECT_NEAR(compressed, 300, 1);
  EXPECT_EQ(part.stats().compressed, static_cast<uint64_t>(compressed));
  EXPECT_EQ(part.stats().stored_raw, static_cast<uint64_t>(1000 - compressed));

  CodecGovernor harder({.base_level = 1,
                        .max_effort = 3.0,
                        .initial_effort = 2.25,
                        .window_bytes = 1 << 30});
  std::map<int, int> levels;
  for (int i = 0; i < 1000; ++i) {
    CodecChoice c = harder.Choose(1000);
    ASSERT_TRUE(c.compress);
    ++levels[c.level];
  }
  EXPECT_EQ(levels.size(), 2u);
  EXPECT_NEAR(levels[2], 750, 1);
  EXPECT_NEAR(levels[3], 250, 1);
}

// Chooses `chunks` chunks of `bytes` each and reports them written at
// `mib_s`; returns how many were compressed.
int WriteWindow(CodecGovernor& g, int chunks, uint64_t bytes, double mib_s) {
  std::vector<CodecChoice> choices;
  for (int i = 0; i < chunks; ++i) choices.push_back(g.Choose(bytes));
  int compressed = 0;
  for (const CodecChoice& c : choices) {
    compressed += c.compress;
    g.Written(c, bytes, static_cast<double>(bytes) / (mib_s * (1 << 20)));
  }
  return compressed;
}

TEST(CodecGovernorTest, MeasuredRatesMoveTheEffortWithinItsBounds) {
  constexpr uint64_t kMiB = 1 << 20;
  CodecGovernor g({.max_effort = 2.0,
                   .window_bytes = 4 * kMiB,
                   .probe_every = 4,
                   .max_probe_every = 8,
                   .tolerance = 0.05,
                   .step_up = 0.25});
  EXPECT_DOUBLE_EQ(g.stats().effort, 1.0);
  // Window 1, every chunk compressed: 100 MiB/s, with no raw rate to compare.
  EXPECT_EQ(WriteWindow(g, 4, kMiB, 100), 4);
  EXPECT_DOUBLE_EQ(g.stats().effort, 1.0);
  EXPECT_EQ(g.stats().windows, 1u);
  // Window 2 probes: every chunk raw, at 400 MiB/s. Raw is faster, so the
  // next probe comes after the first interval (window 6).
  EXPECT_EQ(WriteWindow(g, 4, kMiB, 400), 0);
  EXPECT_EQ(g.stats().probes, 1u);
  EXPECT_NEAR(g.stats().raw_mib_s, 400, 1e-6);
  EXPECT_EQ(g.stats().probe_every, 4);
  EXPECT_DOUBLE_EQ(g.stats().effort, 1.0);
  // Window 3 compresses every chunk again and is 4x slower than raw: the
  // effort falls to a quarter.
  EXPECT_EQ(WriteWindow(g, 4, kMiB, 100), 4);
  EXPECT_NEAR(g.stats().effort, 0.25, 1e-9);
  EXPECT_EQ(g.stats().lowered, 1u);
  // A window gets the effort of when it opened, as its predecessor's last
  // chunk was chosen: window 4 opened at 1, window 5 at 0.25. Both keep up
  // with the raw rate: the effort rises a step each.
  EXPECT_EQ(WriteWindow(g, 4, kMiB, 400), 4);
  EXPECT_NEAR(g.stats().effort, 0.5, 1e-9);
  EXPECT_EQ(WriteWindow(g, 4, kMiB, 400), 1);
  EXPECT_NEAR(g.stats().effort, 0.75, 1e-9);
  // Window 6 probes, and raw is now slower than the window before (200
  // against 400 MiB/s): compressing wins, so the probes space out.
  EXPECT_EQ(WriteWindow(g, 4, kMiB, 200), 0);
  EXPECT_EQ(g.stats().probes, 2u);
  EXPECT_NEAR(g.stats().raw_mib_s, 300, 1e-6);
  EXPECT_EQ(g.stats().probe_every, 8);
  // Windows 7 to 13 are no probes; window 14 is, and finds raw faster: the
  // interval comes back.
  for (int w = 7; w <= 13; ++w) EXPECT_GT(WriteWindow(g, 4, kMiB, 1000), 0);
  EXPECT_EQ(g.stats().probes, 2u);
  EXPECT_EQ(WriteWindow(g, 4, kMiB, 2000), 0);
  EXPECT_EQ(g.stats().probes, 3u);
  EXPECT_EQ(g.stats().probe_every, 4);
  // Keeping up: up to the bound, not past it.
  for (int w = 0; w < 12; ++w) WriteWindow(g, 4, kMiB, 5000);
  EXPECT_DOUBLE_EQ(g.stats().effort, 2.0);
  EXPECT_EQ(g.stats().lowered, 1u);
}

TEST(CodecGovernorTest, AWindowIsMeasuredOnceEveryChunkChosenInItIsWritten) {
  constexpr uint64_t kMiB = 1 << 20;
  CodecGovernor g({.window_bytes = 2 * kMiB, .probe_every = 0});
  // Chunks of two windows chosen before any is written (a pipeline), then
  // written out of order with a chunk of an unknown window.
  const CodecChoice a = g.Choose(kMiB), b = g.Choose(kMiB);
  const CodecChoice c = g.Choose(kMiB);
  EXPECT_EQ(a.window, b.window);
  EXPECT_NE(b.window, c.window);
  g.Written(c, kMiB, 1.0);
  g.Written(CodecChoice{.window = 999}, kMiB, 100.0);
  g.Written(a, kMiB, 0.5);
  EXPECT_EQ(g.stats().windows, 0u);
  g.Written(b, kMiB, 0.5);  // its window's last chunk
  EXPECT_EQ(g.stats().windows, 1u);
  EXPECT_NEAR(g.stats().last_mib_s, 2.0, 1e-9);
  // c's window is not closed: more chunks may still be chosen in it.
  EXPECT_EQ(g.stats().windows, 1u);
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
  // About 50 ms per compressed chunk and 60 ms per raw one: far slower than
  // compressing one, and a difference no stall of a busy test machine
  // hides for a whole window.
  fs.SetWriteThroughput(4 << 20);
  auto governor = std::make_shared<CodecGovernor>(
      CodecGovernorOptions{.window_bytes = 4 * kChunk});
  ShardWriteStats stats =
      WriteAndCheck(&fs, dir_.path() + "/slow.shard", data, governor);
  EXPECT_EQ(stats.compressed + stats.raw_chosen + stats.raw_incompressible,
            24u);
  // Every chunk was reported: six windows of four measured.
  EXPECT_EQ(governor->stats().windows, 6u);
  // Compressed chunks are fewer bytes for such a disk, so every window but
  // the probe of the raw rate (window 2) compresses them all.
  EXPECT_EQ(governor->stats().probes, 1u) << "seed " << seed;
  EXPECT_EQ(stats.raw_chosen, 4u) << "seed " << seed;
  EXPECT_EQ(stats.compressed, 20u) << "seed " << seed;
  EXPECT_EQ(governor->stats().lowered, 0u) << "seed " << seed;
}

TEST_F(WriterUnderGovernorTest, AFastDiskDoesNotWaitForTheCompressor) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  const std::vector<uint8_t> data = Weights(rng, 64 * kChunk / sizeof(float));
  // Writes to tmpfs complete as soon as they are queued, and compressing at
  // zstd's top level takes tens of milliseconds a chunk: a raw window is
  // hundreds of times faster, more than any stall of a busy test machine
  // can hide.
  io::FaultInjectionFs fs(io::DefaultFileSystem());
  fs.DisableDurabilityModel();
  auto governor = std::make_shared<CodecGovernor>(
      CodecGovernorOptions{.base_level = 19, .window_bytes = 4 * kChunk});
  ShardWriteStats stats = WriteAndCheck(
      &fs, "/dev/shm/ckpt-governor-" + std::to_string(seed) + ".shard", data,
      governor);
  (void)io::DefaultFileSystem()->Unlink("/dev/shm/ckpt-governor-" +
                                        std::to_string(seed) + ".shard");
  // Storing raw is far faster than compressing there: after the probe the
  // effort falls, and most chunks are stored raw.
  EXPECT_GT(governor->stats().lowered, 0u) << "seed " << seed;
  EXPECT_LT(governor->stats().effort, 0.8) << "seed " << seed;
  EXPECT_GT(stats.raw_chosen, 32u) << "seed " << seed;
  EXPECT_EQ(stats.compressed + stats.raw_chosen + stats.raw_incompressible,
            64u);
  EXPECT_EQ(governor->stats().windows, 16u);
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
