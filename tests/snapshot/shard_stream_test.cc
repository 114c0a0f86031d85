// A shard file read as a stream, front to back, straight into its items'
// memory: bit-exact for compressed and raw chunks and byte items; a flipped
// byte anywhere, a manifest of another file, or a stream cut short, fail with
// an error naming what.
#include "snapshot/shard_stream.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

using ::testing::HasSubstr;

struct Shard {
  std::string file;
  std::string manifest_bytes;
  std::vector<std::vector<uint8_t>> items;  // raw bytes, in manifest order
};

// Incompressible floats (stored raw), compressible floats (zstd, shuffled), a
// byte item, and an empty tensor; small chunks so that each item has several.
Shard Write(const testing::TempDir& dir, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Shard s;
  s.items.resize(4);
  s.items[0].resize(1 << 20);
  for (auto& b : s.items[0]) b = static_cast<uint8_t>(rng());
  s.items[1].resize(600 << 10);
  for (size_t i = 0; i < s.items[1].size(); i += 4) {
    const float f = static_cast<float>(i % 1000) * 0.5f;
    std::memcpy(&s.items[1][i], &f, 4);
  }
  s.items[2] = {'r', 'n', 'g', 0, 1, 2};
  const std::string path = dir.File("s.shard");
  ShardWriterOptions options;
  options.chunk_size = 256 << 10;
  ShardWriter w(io::DefaultFileSystem(), path, {"job", 3, 0, 1}, options);
  const int64_t n0 = static_cast<int64_t>(s.items[0].size() / 4);
  const int64_t n1 = static_cast<int64_t>(s.items[1].size() / 4);
  EXPECT_TRUE(
      w.AddTensor({"random", proto::DTYPE_FLOAT32, {n0}, {0}, {n0}, s.items[0]})
          .ok());
  EXPECT_TRUE(
      w.AddTensor({"smooth", proto::DTYPE_FLOAT32, {n1}, {0}, {n1}, s.items[1]})
          .ok());
  EXPECT_TRUE(w.AddBytes("rng", s.items[2]).ok());
  EXPECT_TRUE(
      w.AddTensor({"empty", proto::DTYPE_FLOAT32, {0}, {0}, {0}, {}}).ok());
  EXPECT_TRUE(w.Commit().ok());
  auto reader = ShardReader::Open(io::DefaultFileSystem(), path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  s.manifest_bytes = (*reader)->manifest_bytes();
  s.file = testing::ReadAll(path);
  return s;
}

// The stream: `file`, in pieces of random sizes.
StreamRead From(const std::string& file, size_t* at) {
  return [&file, at](absl::Span<uint8_t> out) {
    if (*at + out.size() > file.size()) {
      return absl::UnavailableError("the stream ended");
    }
    std::memcpy(out.data(), file.data() + *at, out.size());
    *at += out.size();
    return absl::OkStatus();
  };
}

absl::Status ReadAllItems(const Shard& s, const std::string& file,
                          const std::string& manifest_bytes,
                          std::vector<std::vector<uint8_t>>* out,
                          io::ThreadPool* pool = nullptr) {
  auto manifest = ParseStreamManifest(manifest_bytes, file.size());
  if (!manifest.ok()) return manifest.status();
  out->clear();
  std::vector<absl::Span<uint8_t>> dst;
  for (const proto::Item& item : manifest->items()) {
    out->emplace_back(item.raw_size(), 0xaa);
    dst.push_back(absl::MakeSpan(out->back()));
  }
  size_t at = 0;
  return ReadShardStream(From(file, &at), file.size(), *manifest,
                         manifest_bytes, dst, pool);
}

TEST(ShardStreamTest, ReadsEveryItemBitExact) {
  testing::TempDir dir;
  const Shard s = Write(dir, 1);
  auto manifest = ParseStreamManifest(s.manifest_bytes, s.file.size());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  // Both kinds of chunks are there.
  EXPECT_EQ(manifest->items(0).chunks(0).codec(), proto::CODEC_NONE);
  EXPECT_EQ(manifest->items(1).chunks(0).codec(), proto::CODEC_ZSTD_PLANES);
  io::ThreadPool pool(2);
  for (io::ThreadPool* decoders :
       {static_cast<io::ThreadPool*>(nullptr), &pool}) {
    std::vector<std::vector<uint8_t>> got;
    absl::Status read =
        ReadAllItems(s, s.file, s.manifest_bytes, &got, decoders);
    ASSERT_TRUE(read.ok()) << read;
    ASSERT_EQ(got.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(got[i], s.items[i]) << "item " << i;
    }
  }
}

TEST(ShardStreamTest, AFlippedByteAnywhereIsCaught) {
  testing::TempDir dir;
  const Shard s = Write(dir, 2);
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  io::ThreadPool pool(2);
  for (int round = 0; round < 200; ++round) {
    std::string bad = s.file;
    const size_t at = rng() % bad.size();
    bad[at] = static_cast<char>(bad[at] ^ (1 << (rng() % 8)));
    std::vector<std::vector<uint8_t>> got;
    absl::Status read = ReadAllItems(s, bad, s.manifest_bytes, &got,
                                     round % 2 == 0 ? &pool : nullptr);
    EXPECT_FALSE(read.ok())
        << "seed " << seed << ": a flip at " << at << " went unnoticed";
  }
}

TEST(ShardStreamTest, ErrorsNameTheChunkAndTheCause) {
  testing::TempDir dir;
  const Shard s = Write(dir, 3);
  auto manifest = ParseStreamManifest(s.manifest_bytes, s.file.size());
  ASSERT_TRUE(manifest.ok());
  // A flip in the raw bytes of the second chunk of "random" (behind its
  // header, or padded to the alignment when its bytes happened to lie
  // page-aligned in memory and it was stored in place).
  std::string bad = s.file;
  const proto::ChunkInfo& raw_chunk = manifest->items(0).chunks(1);
  const uint64_t offset = raw_chunk.file_offset() + StoredOffset(raw_chunk) + 7;
  bad[offset] ^= 1;
  std::vector<std::vector<uint8_t>> got;
  absl::Status read = ReadAllItems(s, bad, s.manifest_bytes, &got);
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.message(), HasSubstr("item \"random\" chunk 1"));
  EXPECT_THAT(read.message(), HasSubstr("checksum mismatch"));
  // The same in a compressed chunk decoded on a pool.
  bad = s.file;
  const proto::ChunkInfo& zstd_chunk = manifest->items(1).chunks(1);
  bad[zstd_chunk.file_offset() + StoredOffset(zstd_chunk) + 7] ^= 1;
  io::ThreadPool pool(2);
  read = ReadAllItems(s, bad, s.manifest_bytes, &got, &pool);
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.message(), HasSubstr("item \"smooth\" chunk 1"));

  // Cut short.
  read = ReadAllItems(s, s.file.substr(0, s.file.size() / 2), s.manifest_bytes,
                      &got);
  EXPECT_FALSE(read.ok());

  // The manifest of another shard routes the bytes wrongly, and is caught.
  testing::TempDir other_dir;
  const Shard other = Write(other_dir, 4);
  read = ReadAllItems(s, s.file, other.manifest_bytes, &got);
  EXPECT_FALSE(read.ok());

  // Destinations of the wrong size are refused before anything is read.
  std::vector<uint8_t> small(10);
  size_t at = 0;
  read = ReadShardStream(From(s.file, &at), s.file.size(), *manifest,
                         s.manifest_bytes,
                         {absl::MakeSpan(small), absl::MakeSpan(small),
                          absl::MakeSpan(small), absl::MakeSpan(small)});
  EXPECT_EQ(read.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(at, 0u);
}

}  // namespace
}  // namespace ckpt::snapshot
