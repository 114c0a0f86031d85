// Random tensors of every dtype through every codec/filter combination,
// bit-exact; range reads; and the writer's refusals of bad input.
#include <cstring>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/dtype.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_stream.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

using ::testing::HasSubstr;

struct Combo {
  proto::Codec codec;
  bool shuffle;
  uint32_t chunk_size;
  bool direct;
  bool planes = true;  // the byte-plane codec (format 4) where it applies
};

std::string ComboName(const ::testing::TestParamInfo<Combo>& info) {
  const Combo& c = info.param;
  return std::string(c.codec == proto::CODEC_ZSTD ? "zstd" : "none") +
         (c.shuffle ? "_shuffle" : "_noshuffle") + "_chunk" +
         std::to_string(c.chunk_size) + (c.direct ? "_direct" : "_buffered") +
         (c.planes ? "" : "_noplanes");
}

// Values that look like a real tensor of the dtype: compressible but not
// trivially so.
std::vector<uint8_t> TensorData(proto::DType dtype, size_t elements,
                                std::mt19937_64& rng) {
  size_t width = DTypeSize(dtype);
  std::vector<uint8_t> out(elements * width);
  std::normal_distribution<double> normal(0, 1);
  for (size_t i = 0; i < elements; ++i) {
    double v = normal(rng);
    uint8_t* p = &out[i * width];
    switch (dtype) {
      case proto::DTYPE_FLOAT32: {
        float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case proto::DTYPE_FLOAT64:
        std::memcpy(p, &v, 8);
        break;
      case proto::DTYPE_BOOL:
        *p = rng() & 1;
        break;
      default: {
        uint64_t x = (rng() % 4 == 0) ? rng() : static_cast<uint64_t>(v * 100);
        std::memcpy(p, &x, width);
      }
    }
  }
  return out;
}

class RoundTripTest : public ::testing::TestWithParam<Combo> {
 protected:
  testing::TempDir dir_;
};

TEST_P(RoundTripTest, EveryDTypeIsBitExact) {
  const Combo& combo = GetParam();
  uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  ShardWriterOptions options;
  options.codec.codec = combo.codec;
  options.codec.shuffle = combo.shuffle;
  options.codec.planes = combo.planes;
  options.chunk_size = combo.chunk_size;
  options.direct_io = combo.direct;
  const std::string path = dir_.File("s.shard");
  ShardWriter writer(io::DefaultFileSystem(), path, {"rt", 7, 1, 3}, options);

  std::map<std::string, std::vector<uint8_t>> expected;
  for (proto::DType dtype : AllDTypes()) {
    // 2-D box of a larger global tensor; sizes straddle chunk boundaries.
    int64_t rows = 1 + static_cast<int64_t>(rng() % 40),
            cols = 1 + static_cast<int64_t>(rng() % 300);
    std::string name = "t/" + DTypeName(dtype);
    expected[name] = TensorData(dtype, rows * cols, rng);
    ASSERT_TRUE(writer
                    .AddTensor({name,
                                dtype,
                                {rows * 3, cols},
                                {rows, 0},
                                {rows, cols},
                                absl::MakeConstSpan(expected[name])})
                    .ok());
  }
  expected["empty"] = {};
  ASSERT_TRUE(
      writer
          .AddTensor(
              {"empty", proto::DTYPE_FLOAT32, {0, 5}, {0, 0}, {0, 5}, {}})
          .ok());
  expected["scalar"] = TensorData(proto::DTYPE_FLOAT64, 1, rng);
  ASSERT_TRUE(
      writer
          .AddTensor(
              {"scalar", proto::DTYPE_FLOAT64, {}, {}, {}, expected["scalar"]})
          .ok());
  expected["blob"] = testing::RandomBytes(rng, 5000 + rng() % 50000);
  ASSERT_TRUE(writer.AddBytes("blob", expected["blob"]).ok());
  expected["no-bytes"] = {};
  ASSERT_TRUE(writer.AddBytes("no-bytes", {}).ok());

  auto manifest = writer.Commit();
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_FALSE(*io::DefaultFileSystem()->Exists(path + ".tmp"));

  auto reader =
      ShardReader::Open(io::DefaultFileSystem(), path,
                        ShardReaderOptions{.direct_io = combo.direct});
  ASSERT_TRUE(reader.ok()) << reader.status();
  const proto::ShardManifest& m = (*reader)->manifest();
  EXPECT_EQ(m.job(), "rt");
  EXPECT_EQ(m.step(), 7u);
  EXPECT_EQ(m.rank(), 1u);
  EXPECT_EQ(m.world_size(), 3u);
  EXPECT_EQ(m.items_size(), static_cast<int>(expected.size()));
  for (const auto& [name, bytes] : expected) {
    std::vector<uint8_t> back(bytes.size(), 0xAB);
    ASSERT_TRUE((*reader)->ReadItem(name, absl::MakeSpan(back)).ok()) << name;
    EXPECT_EQ(back, bytes) << name;
    // A few random ranges, decoded from only the chunks they touch.
    for (int k = 0; k < 5 && !bytes.empty(); ++k) {
      uint64_t off = rng() % bytes.size();
      uint64_t len = rng() % (bytes.size() - off + 1);
      std::vector<uint8_t> part(len);
      ASSERT_TRUE(
          (*reader)->ReadItemRange(name, off, absl::MakeSpan(part)).ok());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), bytes.begin() + off))
          << name;
    }
  }
  EXPECT_TRUE((*reader)->VerifyAll().empty());
  int plane_chunks = 0;
  for (const proto::Item& item : m.items()) {
    for (const proto::ChunkInfo& c : item.chunks()) {
      plane_chunks += c.codec() == proto::CODEC_ZSTD_PLANES;
      if (combo.codec == proto::CODEC_NONE) {
        EXPECT_EQ(c.codec(), proto::CODEC_NONE);
      }
      if (!combo.shuffle) {
        EXPECT_NE(c.filter(), proto::FILTER_BYTE_SHUFFLE);
      }
    }
  }
  // Plane-coded chunks exactly where the codec, the shuffle and the option
  // allow them (the float tensors' chunks compress).
  EXPECT_EQ(plane_chunks > 0,
            combo.codec == proto::CODEC_ZSTD && combo.shuffle && combo.planes);
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, RoundTripTest,
    ::testing::Values(Combo{proto::CODEC_NONE, false, 4096, true},
                      Combo{proto::CODEC_ZSTD, false, 4096, true},
                      Combo{proto::CODEC_ZSTD, true, 4096, true},
                      Combo{proto::CODEC_ZSTD, true, 65536, false},
                      Combo{proto::CODEC_ZSTD, true, 65536, true, false},
                      Combo{proto::CODEC_NONE, false, 1 << 20, false},
                      Combo{proto::CODEC_ZSTD, true, 4 << 20, true}),
    ComboName);

TEST(ShardWriterTest, RefusesBadInputWithClearErrors) {
  testing::TempDir dir;
  ShardWriter writer(io::DefaultFileSystem(), dir.File("x.shard"),
                     {"j", 1, 0, 1}, {});
  std::vector<uint8_t> data(16);
  EXPECT_THAT(
      writer.AddTensor({"a/../b", proto::DTYPE_FLOAT32, {4}, {0}, {4}, data})
          .message(),
      HasSubstr("'..'"));
  EXPECT_THAT(writer.AddTensor({"t", proto::DTYPE_FLOAT32, {4}, {2}, {4}, data})
                  .message(),
              HasSubstr("outside"));
  EXPECT_THAT(writer.AddTensor({"t", proto::DTYPE_FLOAT32, {8}, {0}, {8}, data})
                  .message(),
              HasSubstr("needs 32 bytes, data has 16"));
  EXPECT_THAT(
      writer.AddTensor({"t", proto::DTYPE_UNSPECIFIED, {4}, {0}, {4}, data})
          .message(),
      HasSubstr("not storable"));
  EXPECT_THAT(
      writer.AddTensor({"t", proto::DTYPE_FLOAT32, {4, 1}, {0}, {4}, data})
          .message(),
      HasSubstr("2 dims"));
  ASSERT_TRUE(
      writer.AddTensor({"t", proto::DTYPE_FLOAT32, {4}, {0}, {4}, data}).ok());
  EXPECT_EQ(writer.AddBytes("t", data).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(writer.Commit().ok());
  EXPECT_EQ(writer.Commit().status().code(),
            absl::StatusCode::kFailedPrecondition);

  ShardWriter bad_rank(io::DefaultFileSystem(), dir.File("y.shard"),
                       {"j", 1, 4, 4}, {});
  EXPECT_THAT(bad_rank.Commit().status().message(),
              HasSubstr("outside world size"));
  ShardWriter bad_job(io::DefaultFileSystem(), dir.File("z.shard"),
                      {"../etc", 1, 0, 1}, {});
  EXPECT_EQ(bad_job.Commit().status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(*io::DefaultFileSystem()->Exists(dir.File("y.shard")));
}

// Chunk hashes the caller already knows (a client took them of its slot) are
// what the manifest records: the writer does not hash those chunks again. A
// wrong one is not silently right: the read that checks it fails.
TEST(ShardWriterTest, KnownChunkHashesAreRecordedAndCheckedOnRead) {
  testing::TempDir dir;
  ShardWriterOptions options;
  options.chunk_size = 4096;
  options.codec.codec = proto::CODEC_NONE;
  std::vector<uint8_t> data(3 * 4096 - 100);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint64_t> hashes;
  for (size_t off = 0; off < data.size(); off += 4096) {
    hashes.push_back(Checksum(absl::MakeConstSpan(
        data.data() + off, std::min<size_t>(4096, data.size() - off))));
  }
  const int64_t n = static_cast<int64_t>(data.size());
  {
    ShardWriter writer(io::DefaultFileSystem(), dir.File("a.shard"),
                       {"j", 1, 0, 1}, options);
    EXPECT_THAT(writer
                    .AddTensor({"t",
                                proto::DTYPE_UINT8,
                                {n},
                                {0},
                                {n},
                                data,
                                absl::MakeConstSpan(hashes).subspan(1)})
                    .message(),
                HasSubstr("2 chunk hashes given for 3 chunks"));
    ASSERT_TRUE(
        writer.AddTensor({"t", proto::DTYPE_UINT8, {n}, {0}, {n}, data, hashes})
            .ok());
    auto manifest = writer.Commit();
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    for (int c = 0; c < 3; ++c)
      EXPECT_EQ(manifest->items(0).chunks(c).raw_xxh3(), hashes[c]);
    auto reader =
        ShardReader::Open(io::DefaultFileSystem(), dir.File("a.shard"));
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::vector<uint8_t> back(data.size());
    ASSERT_TRUE((*reader)->ReadItem("t", absl::MakeSpan(back)).ok());
    EXPECT_EQ(back, data);
  }
  std::vector<uint64_t> wrong = hashes;
  wrong[1] ^= 1;
  ShardWriter writer(io::DefaultFileSystem(), dir.File("b.shard"),
                     {"j", 1, 0, 1}, options);
  ASSERT_TRUE(writer.AddBytes("b", data, wrong).ok());
  ASSERT_TRUE(writer.Commit().ok());
  auto reader = ShardReader::Open(io::DefaultFileSystem(), dir.File("b.shard"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<uint8_t> back(data.size());
  EXPECT_EQ((*reader)->ReadItem("b", absl::MakeSpan(back)).code(),
            absl::StatusCode::kDataLoss);
}

TEST(ShardReaderTest, MissingItemsAndBadRangesNameTheShard) {
  testing::TempDir dir;
  const std::string path = dir.File("s.shard");
  ShardWriter writer(io::DefaultFileSystem(), path, {"j", 1, 0, 1}, {});
  std::vector<uint8_t> data(100, 1);
  ASSERT_TRUE(writer.AddBytes("b", data).ok());
  ASSERT_TRUE(writer.Commit().ok());
  auto reader = ShardReader::Open(io::DefaultFileSystem(), path);
  ASSERT_TRUE(reader.ok());
  std::vector<uint8_t> out(100);
  absl::Status s = (*reader)->ReadItem("nope", absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_EQ((*reader)
                ->ReadItemRange("b", 90, absl::MakeSpan(out).subspan(0, 20))
                .code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*reader)->ReadItem("b", absl::MakeSpan(out).subspan(0, 5)).code(),
            absl::StatusCode::kInvalidArgument);
  auto missing =
      ShardReader::Open(io::DefaultFileSystem(), dir.File("none.shard"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// Many items read in one pass come back as each read alone does, small and
// multi-chunk ones mixed; a wrong size, an unknown name or a name asked twice
// is refused before anything is read.
TEST(ShardReaderTest, ItemsReadInOnePassMatchEachReadAlone) {
  testing::TempDir dir;
  const std::string path = dir.File("s.shard");
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  ShardWriterOptions options;
  options.chunk_size = 64 << 10;
  ShardWriter writer(io::DefaultFileSystem(), path, {"j", 1, 0, 1}, options);
  std::vector<std::vector<uint8_t>> items;
  for (size_t size : {size_t{7}, size_t{300} << 10, size_t{0}, size_t{4096},
                      size_t{64} << 10}) {
    std::vector<uint8_t>& data = items.emplace_back(size);
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng() % 16);
    ASSERT_TRUE(
        writer.AddBytes("item" + std::to_string(items.size() - 1), data).ok());
  }
  ASSERT_TRUE(writer.Commit().ok());
  auto reader = ShardReader::Open(io::DefaultFileSystem(), path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::vector<uint8_t>> back(items.size());
  std::vector<ShardReader::ItemRead> reads;
  for (size_t i = items.size(); i-- > 0;) {  // in another order than stored
    back[i].resize(items[i].size());
    reads.push_back({"item" + std::to_string(i), absl::MakeSpan(back[i])});
  }
  ASSERT_TRUE((*reader)->ReadItems(reads).ok()) << "seed " << seed;
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(back[i], items[i]) << "item " << i << " seed " << seed;
  }
  std::vector<uint8_t> small(3);
  absl::Status s = (*reader)->ReadItems({{"item0", absl::MakeSpan(small)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("\"item0\" has 7 bytes"));
  EXPECT_EQ((*reader)->ReadItems({{"nope", {}}}).code(),
            absl::StatusCode::kNotFound);
  s = (*reader)->ReadItems(
      {{"item3", absl::MakeSpan(back[3])}, {"item3", absl::MakeSpan(back[3])}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("asked for twice"));
}

// A model's state is thousands of small items (biases, norms, optimizer
// scalars): each is found by name however many there are, and read back in
// one pass in any order.
TEST(ShardReaderTest, EachOfThousandsOfItemsIsFoundByName) {
  testing::TempDir dir;
  const std::string path = dir.File("many.shard");
  ShardWriter writer(io::DefaultFileSystem(), path, {"j", 1, 0, 1}, {});
  constexpr int kItems = 5000;
  std::vector<std::string> values(kItems);
  for (int i = 0; i < kItems; ++i) {
    values[i] = "value of item " + std::to_string(i * 7919);
    ASSERT_TRUE(
        writer
            .AddBytes("layers." + std::to_string(i) + ".bias",
                      {reinterpret_cast<const uint8_t*>(values[i].data()),
                       values[i].size()})
            .ok());
  }
  ASSERT_TRUE(writer.Commit().ok());
  auto reader = ShardReader::Open(io::DefaultFileSystem(), path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> back(kItems);
  std::vector<ShardReader::ItemRead> reads;
  for (int i = kItems; i-- > 0;) {
    back[i].resize(values[i].size());
    reads.push_back(
        {"layers." + std::to_string(i) + ".bias",
         {reinterpret_cast<uint8_t*>(back[i].data()), back[i].size()}});
  }
  ASSERT_TRUE((*reader)->ReadItems(reads).ok());
  EXPECT_EQ(back, values);
  auto item = (*reader)->FindItem("layers.4321.bias");
  ASSERT_TRUE(item.ok());
  EXPECT_EQ((*item)->raw_size(), values[4321].size());
  EXPECT_TRUE(
      absl::IsNotFound((*reader)->FindItem("layers.5000.bias").status()));
}

// A file written in format 1 (before chunks could be stored in place) reads
// and verifies, from a file and as a stream.
TEST(ShardReaderTest, FormatOneFilesStillRead) {
  auto reader = ShardReader::Open(io::DefaultFileSystem(), CKPT_FORMAT1_SHARD);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const proto::ShardManifest& m = (*reader)->manifest();
  EXPECT_EQ(m.format_version(), 1u);
  ASSERT_EQ(m.items_size(), 3);
  EXPECT_EQ(m.items(0).chunks(0).codec(), proto::CODEC_ZSTD);
  EXPECT_EQ(m.items(1).chunks(0).codec(), proto::CODEC_NONE);
  EXPECT_TRUE((*reader)->VerifyAll().empty());
  std::vector<std::vector<uint8_t>> items;
  std::vector<absl::Span<uint8_t>> dst;
  for (const proto::Item& item : m.items()) {
    items.emplace_back(item.raw_size());
    ASSERT_TRUE(
        (*reader)->ReadItem(item.name(), absl::MakeSpan(items.back())).ok());
  }
  std::vector<std::vector<uint8_t>> streamed;
  for (const proto::Item& item : m.items()) {
    streamed.emplace_back(item.raw_size());
    dst.push_back(absl::MakeSpan(streamed.back()));
  }
  const std::string file = testing::ReadAll(CKPT_FORMAT1_SHARD);
  size_t at = 0;
  auto read = [&](absl::Span<uint8_t> out) {
    if (file.size() - at < out.size())
      return absl::OutOfRangeError("end of stream");
    std::memcpy(out.data(), file.data() + at, out.size());
    at += out.size();
    return absl::OkStatus();
  };
  auto parsed = ParseStreamManifest((*reader)->manifest_bytes(), file.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(ReadShardStream(read, file.size(), *parsed,
                              (*reader)->manifest_bytes(), dst)
                  .ok());
  EXPECT_EQ(streamed, items);
}

}  // namespace
}  // namespace ckpt::snapshot
