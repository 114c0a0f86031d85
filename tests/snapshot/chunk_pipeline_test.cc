#include "snapshot/chunk_pipeline.h"

#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "snapshot/format.h"

namespace ckpt::snapshot {
namespace {

constexpr size_t kChunk = 4096;

// The chunks of `data` as item 0, in order.
std::vector<ChunkPipeline::Chunk> ChunksOf(const std::string& data) {
  std::vector<ChunkPipeline::Chunk> chunks;
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  for (size_t off = 0, i = 0; off < data.size(); off += kChunk, ++i) {
    ChunkPipeline::Chunk& c = chunks.emplace_back();
    c.header.item_index = 0;
    c.header.chunk_index = static_cast<uint32_t>(i);
    c.header.raw_offset = off;
    c.header.element_width = 4;
    c.raw = absl::MakeConstSpan(bytes + off,
                                std::min<size_t>(kChunk, data.size() - off));
  }
  return chunks;
}

std::string Pattern(size_t bytes) {
  std::string data(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 7 / 5);
  return data;
}

TEST(ChunkPipelineTest, HandsOutEveryChunkEncodedInFileOrder) {
  const std::string data = Pattern(40 * kChunk + 100);
  io::ThreadPool pool(3);
  ChunkPipeline pipeline(ChunksOf(data), CodecOptions{}, nullptr, &pool, 0,
                         kChunk);
  uint32_t expected = 0;
  while (std::optional<ChunkPipeline::Result> r = pipeline.Next()) {
    ASSERT_TRUE(r->encoded.ok()) << r->encoded.status();
    EXPECT_FALSE(r->unchanged);
    EXPECT_EQ(r->header.chunk_index, expected++);
    EXPECT_EQ(r->header.raw_xxh3, Checksum(r->chunk->raw));
    EXPECT_GT(r->encoded->size(), 0u);
    pipeline.Handed(*r);
  }
  EXPECT_EQ(expected, 41u);
  EXPECT_FALSE(pipeline.AwaitsDrain()) << "no governor to report to";
}

TEST(ChunkPipelineTest, AChunkHashingLikeItsBaseChunkIsUnchangedAndNotEncoded) {
  const std::string data = Pattern(3 * kChunk);
  std::vector<ChunkPipeline::Chunk> chunks = ChunksOf(data);
  proto::ChunkInfo same, other, trusted;
  same.set_raw_xxh3(Checksum(chunks[0].raw));
  other.set_raw_xxh3(Checksum(chunks[1].raw) + 1);
  // A hash the caller knew is trusted over the bytes.
  trusted.set_raw_xxh3(12345);
  chunks[2].known_xxh3 = 12345;
  chunks[0].base_chunk = &same;
  chunks[1].base_chunk = &other;
  chunks[2].base_chunk = &trusted;
  ChunkPipeline pipeline(std::move(chunks), CodecOptions{}, nullptr, nullptr, 2,
                         kChunk);
  EXPECT_EQ(pipeline.SpaceBound(), 0u) << "each chunk may be unchanged";
  std::vector<bool> unchanged;
  while (std::optional<ChunkPipeline::Result> r = pipeline.Next()) {
    ASSERT_TRUE(r->encoded.ok());
    unchanged.push_back(r->unchanged);
    if (r->unchanged) EXPECT_EQ(r->encoded->size(), 0u);
  }
  EXPECT_EQ(unchanged, (std::vector<bool>{true, false, true}));
}

TEST(ChunkPipelineTest, SpaceBoundCoversEveryChunkStoredRaw) {
  const std::string data = Pattern(5 * kChunk + 1);
  ChunkPipeline pipeline(ChunksOf(data), CodecOptions{}, nullptr, nullptr, 1,
                         kChunk);
  uint64_t bound = 0;
  for (size_t size : {kChunk, kChunk, kChunk, kChunk, kChunk, size_t{1}})
    bound += ChunkFootprint(kAlignment, size);
  EXPECT_EQ(pipeline.SpaceBound(), bound);
}

// A writer that stops early (a write failed) destroys the pipeline with
// chunks still being encoded: it waits for them.
TEST(ChunkPipelineTest, AWriterThatStopsEarlyLeavesNothingRunning) {
  const std::string data = Pattern(200 * kChunk);
  io::ThreadPool pool(2);
  {
    ChunkPipeline pipeline(ChunksOf(data), CodecOptions{}, nullptr, &pool, 0,
                           kChunk);
    ASSERT_TRUE(pipeline.Next().has_value());
  }
  // The pool is idle again: a task scheduled now runs.
  absl::Notification ran;
  pool.Schedule([&ran] { ran.Notify(); });
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
}

}  // namespace
}  // namespace ckpt::snapshot
