#include "snapshot/plane_codec.h"

#include <zstd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/filter.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

using ::testing::HasSubstr;

// Elements of `width` bytes that look like training state: the value's sign
// and exponent bytes (the high ones) cluster, the low ones are noise. For
// widths without a float type, the high half of each element is a small
// integer and the low half noise.
std::vector<uint8_t> FloatLike(std::mt19937_64& rng, size_t n, size_t width) {
  std::vector<uint8_t> out(n);
  std::normal_distribution<double> normal(0, 0.02);
  size_t i = 0;
  for (; i + width <= n; i += width) {
    const double v = normal(rng);
    if (width == 4) {
      const float f = static_cast<float>(v);
      std::memcpy(&out[i], &f, 4);
    } else if (width == 8) {
      std::memcpy(&out[i], &v, 8);
    } else if (width == 2) {  // bfloat16: the high half of a float
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&out[i], &h, 2);
    } else {
      for (size_t b = 0; b < width; ++b) {
        out[i + b] = b < width / 2 ? static_cast<uint8_t>(rng())
                                   : static_cast<uint8_t>(rng() % 3);
      }
    }
  }
  for (; i < n; ++i) out[i] = static_cast<uint8_t>(rng());
  return out;
}

uint32_t PlaneSize(const std::vector<uint8_t>& stored, size_t b) {
  uint32_t v;
  std::memcpy(&v, stored.data() + 4 * b, 4);
  return v;
}

// Round trips over every width, sizes with and without a tail, planes below
// and above the probe's threshold, sources at odd addresses.
TEST(PlaneCodecTest, RoundTripsEveryWidthSizeAndAlignment) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (size_t width = kMinPlaneWidth; width <= kMaxPlaneWidth; ++width) {
    for (size_t n :
         {size_t{4096}, size_t{4097}, size_t{65536 + 13}, size_t{(1 << 20) + 7},
          size_t{rng() % 300000 + kMinPlanesBytes}}) {
      if (n < width) continue;
      for (size_t shift : {0u, 3u}) {
        std::vector<uint8_t> buffer(n + shift);
        const std::vector<uint8_t> raw = FloatLike(rng, n, width);
        std::memcpy(buffer.data() + shift, raw.data(), n);
        std::vector<uint8_t> stored(PlanesStoredBound(n, width));
        PlaneOptions options;
        options.probe_bytes = 4096;
        absl::StatusOr<size_t> size = EncodePlanes(
            {buffer.data() + shift, n}, width, options, stored.data());
        ASSERT_TRUE(size.ok()) << size.status();
        ASSERT_GT(*size, 0u) << "width " << width << " n " << n;
        ASSERT_LE(*size, stored.size());
        std::vector<uint8_t> back(n);
        absl::Status d =
            DecodePlanes({stored.data(), *size}, width, absl::MakeSpan(back));
        ASSERT_TRUE(d.ok()) << d << " width " << width << " n " << n;
        ASSERT_EQ(back, raw) << "width " << width << " n " << n;
      }
    }
  }
}

// fp32 training-like state: the two low mantissa planes are stored raw, the
// sign-and-exponent plane is compressed, and the whole is smaller than
// byte-shuffle + zstd -1 of the same bytes.
TEST(PlaneCodecTest, NoisePlanesAreStoredRawAndExponentsCompressed) {
  std::mt19937_64 rng(testing::TestSeed());
  const size_t n = 4 << 20;
  const std::vector<uint8_t> raw = FloatLike(rng, n, 4);
  std::vector<uint8_t> stored(PlanesStoredBound(n, 4));
  absl::StatusOr<size_t> size = EncodePlanes(raw, 4, {}, stored.data());
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(PlaneSize(stored, 0), n / 4);
  EXPECT_EQ(PlaneSize(stored, 1), n / 4);
  EXPECT_LT(PlaneSize(stored, 3), n / 4 / 2);

  std::vector<uint8_t> shuffled(n), frame(ZSTD_compressBound(n));
  ByteShuffle(raw.data(), shuffled.data(), n, 4);
  const size_t reference =
      ZSTD_compress(frame.data(), frame.size(), shuffled.data(), n, 1);
  ASSERT_FALSE(ZSTD_isError(reference));
  EXPECT_LE(*size, reference);
}

TEST(PlaneCodecTest, NoiseIsLeftToTheCallerToStoreRaw) {
  std::mt19937_64 rng(testing::TestSeed());
  for (size_t n : {size_t{4096}, size_t{1 << 20}}) {
    const std::vector<uint8_t> raw = testing::RandomBytes(rng, n);
    std::vector<uint8_t> stored(PlanesStoredBound(n, 4));
    absl::StatusOr<size_t> size = EncodePlanes(raw, 4, {}, stored.data());
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(*size, 0u) << n;
  }
}

// Every lie a stored chunk can tell about its planes is an error, never a
// crash or a write past the output.
TEST(PlaneCodecTest, LyingPlaneTablesAreErrors) {
  std::mt19937_64 rng(testing::TestSeed());
  const size_t n = 64 * 1024 + 3, width = 4, plane = n / width;
  const std::vector<uint8_t> raw = FloatLike(rng, n, width);
  std::vector<uint8_t> good(PlanesStoredBound(n, width));
  absl::StatusOr<size_t> size = EncodePlanes(raw, width, {}, good.data());
  ASSERT_TRUE(size.ok() && *size > 0);
  good.resize(*size);
  ASSERT_LT(PlaneSize(good, 3), plane);  // the exponents are a zstd frame

  auto decode = [&](std::vector<uint8_t> stored, size_t w = 4) {
    std::vector<uint8_t> back(n);
    return DecodePlanes(stored, w, absl::MakeSpan(back));
  };
  auto set_size = [](std::vector<uint8_t> s, size_t b, uint32_t v) {
    std::memcpy(s.data() + 4 * b, &v, 4);
    return s;
  };
  EXPECT_TRUE(decode(good).ok());
  EXPECT_THAT(decode(set_size(good, 0, plane + 1)).message(),
              HasSubstr("exceeds its raw size"));
  EXPECT_THAT(decode(set_size(good, 3, PlaneSize(good, 3) - 1)).message(),
              HasSubstr("planes and tail take"));
  EXPECT_THAT(decode({good.begin(), good.begin() + 10}).message(),
              HasSubstr("cannot hold"));
  std::vector<uint8_t> shorter(good.begin(), good.end() - 1);
  EXPECT_FALSE(decode(shorter).ok());
  EXPECT_THAT(decode(good, 1).message(), HasSubstr("element width 1"));
  EXPECT_THAT(decode(good, 17).message(), HasSubstr("element width 17"));

  // The exponent plane's frame, given one byte less than it has and the raw
  // plane 2 one more: the sizes add up, the frame is cut short.
  std::vector<uint8_t> cut = set_size(good, 3, PlaneSize(good, 3) - 1);
  cut = set_size(cut, 2, PlaneSize(good, 2) + 1);
  EXPECT_FALSE(decode(cut).ok());

  // Every single-byte flip anywhere: an error or other bytes, never a crash.
  for (size_t i = 0; i < good.size(); i += 1 + good.size() / 2000) {
    std::vector<uint8_t> flipped = good;
    flipped[i] ^= 0x5a;
    std::vector<uint8_t> back(n);
    (void)DecodePlanes(flipped, width, absl::MakeSpan(back));
  }
}

// Through the chunk codec: plane-coded chunks carry CODEC_ZSTD_PLANES in
// format 4, their checksums catch any flip, and a header that claims planes
// in format 3 or without the shuffle filter is refused.
TEST(PlaneCodecTest, ChunksCodedByPlanesAreCheckedLikeAnyOther) {
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<uint8_t> raw = FloatLike(rng, 256 << 10, 2);
  ChunkHeader h;
  absl::StatusOr<EncodedChunk> e = EncodeChunk(raw, 2, {}, nullptr, &h);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(h.codec, proto::CODEC_ZSTD_PLANES);
  EXPECT_EQ(h.filter, proto::FILTER_BYTE_SHUFFLE);
  EXPECT_EQ(h.version, kFormatVersion);
  std::vector<uint8_t> stored(e->head.data() + h.stored_offset,
                              e->head.data() + h.stored_offset + h.stored_size);
  std::vector<uint8_t> back(raw.size());
  ASSERT_TRUE(DecodeChunk(h, stored, absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, raw);

  for (size_t i = 0; i < stored.size(); i += 1 + stored.size() / 500) {
    std::vector<uint8_t> flipped = stored;
    flipped[i] ^= 1;
    EXPECT_FALSE(DecodeChunk(h, flipped, absl::MakeSpan(back)).ok()) << i;
  }
  ChunkHeader old = h;
  old.version = 3;
  EXPECT_THAT(DecodeChunk(old, stored, absl::MakeSpan(back)).message(),
              HasSubstr("in format 3"));
  ChunkHeader unfiltered = h;
  unfiltered.filter = proto::FILTER_NONE;
  EXPECT_THAT(DecodeChunk(unfiltered, stored, absl::MakeSpan(back)).message(),
              HasSubstr("without the byte-shuffle filter"));

  // With the plane codec off, the same chunk is one zstd frame.
  CodecOptions whole;
  whole.planes = false;
  ChunkHeader hw;
  ASSERT_TRUE(EncodeChunk(raw, 2, whole, nullptr, &hw).ok());
  EXPECT_EQ(hw.codec, proto::CODEC_ZSTD);
}

// A manifest that names plane-coded chunks in a format before 4, or with
// elements the plane codec does not take, is refused before any chunk is read.
TEST(PlaneCodecTest, ManifestsOfEarlierFormatsCannotNamePlanes) {
  testing::TempDir dir;
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<uint8_t> raw = FloatLike(rng, 64 << 10, 4);
  const std::string path = dir.File("s.shard");
  {
    ShardWriter writer(io::DefaultFileSystem(), path, {"job", 1, 0, 1}, {});
    const int64_t n = static_cast<int64_t>(raw.size() / 4);
    ASSERT_TRUE(writer
                    .AddTensor({"w",
                                proto::DTYPE_FLOAT32,
                                {n},
                                {0},
                                {n},
                                absl::MakeConstSpan(raw)})
                    .ok());
    ASSERT_TRUE(writer.Commit().ok());
  }
  auto reader = ShardReader::Open(io::DefaultFileSystem(), path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->VerifyAll().empty());
  proto::ShardManifest m = (*reader)->manifest();
  ASSERT_EQ(m.items(0).chunks(0).codec(), proto::CODEC_ZSTD_PLANES);
  EXPECT_TRUE(ValidateManifest(m, m.data_size()).ok());
  proto::ShardManifest old = m;
  old.set_format_version(3);
  EXPECT_THAT(ValidateManifest(old, old.data_size()).message(),
              HasSubstr("unknown codec 3 or filter 2 in format 3"));
  proto::ShardManifest unfiltered = m;
  unfiltered.mutable_items(0)->mutable_chunks(0)->set_filter(
      proto::FILTER_NONE);
  EXPECT_THAT(ValidateManifest(unfiltered, m.data_size()).message(),
              HasSubstr("byte planes need the byte-shuffle filter"));
}

// A writer asked for format 3 (ckptd --shard-format 3, while some node reads
// only 3) writes no plane-coded chunk and format-3 headers; a format-4 writer
// does not build on a format-3 base (the first save after an upgrade is
// full); formats writers do not write are refused by number.
TEST(PlaneCodecTest, WritersWriteTheFormatTheyAreAskedFor) {
  testing::TempDir dir;
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<uint8_t> raw = FloatLike(rng, 64 << 10, 4);
  const int64_t n = static_cast<int64_t>(raw.size() / 4);
  auto write = [&](const std::string& path, uint64_t step, uint32_t version,
                   std::shared_ptr<ShardBase> base) {
    ShardWriterOptions options;
    options.codec.format_version = version;
    options.base = std::move(base);
    ShardWriter writer(io::DefaultFileSystem(), path, {"job", step, 0, 1},
                       options);
    absl::Status s = writer.AddTensor(
        {"w", proto::DTYPE_FLOAT32, {n}, {0}, {n}, absl::MakeConstSpan(raw)});
    return s.ok() ? writer.Commit() : absl::StatusOr<proto::ShardManifest>(s);
  };
  auto three = write(dir.File("3.shard"), 1, 3, nullptr);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->format_version(), 3u);
  EXPECT_EQ(three->items(0).chunks(0).codec(), proto::CODEC_ZSTD);
  auto reader = ShardReader::Open(io::DefaultFileSystem(), dir.File("3.shard"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->VerifyAll().empty());

  auto base = std::make_shared<ShardBase>();
  base->manifest = (*reader)->manifest();
  base->manifest_xxh3 = Checksum(absl::MakeConstSpan(
      reinterpret_cast<const uint8_t*>((*reader)->manifest_bytes().data()),
      (*reader)->manifest_bytes().size()));
  auto four = write(dir.File("4.shard"), 2, 4, base);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->format_version(), 4u);
  EXPECT_EQ(four->bases_size(), 0);  // the unchanged chunk is written again
  EXPECT_EQ(four->items(0).chunks(0).codec(), proto::CODEC_ZSTD_PLANES);
  auto also_three = write(dir.File("3b.shard"), 2, 3, base);
  ASSERT_TRUE(also_three.ok()) << also_three.status();
  EXPECT_EQ(also_three->bases_size(), 1);  // same format: built on it

  for (uint32_t version : {2u, kFormatVersion + 1}) {
    auto refused = write(dir.File("x.shard"), 3, version, nullptr);
    EXPECT_THAT(
        refused.status().message(),
        HasSubstr(absl::StrCat("shard format ", version,
                               ": writers write 3 to ", kFormatVersion)));
  }
}

}  // namespace
}  // namespace ckpt::snapshot
