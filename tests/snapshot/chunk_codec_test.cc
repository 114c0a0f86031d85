#include "snapshot/chunk_codec.h"

#include <zstd.h>

#include <cstring>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapshot/filter.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

using ::testing::HasSubstr;

// The stored bytes of a chunk encoded into one buffer.
absl::Span<const uint8_t> Stored(const EncodedChunk& e, const ChunkHeader& h) {
  EXPECT_TRUE(e.body.empty() && e.tail.empty());
  EXPECT_EQ(h.stored_offset, kChunkHeaderSize);
  return {e.head.data() + h.stored_offset, h.stored_size};
}

TEST(FilterTest, ShuffleGroupsBytesByPositionAndKeepsTheTail) {
  const uint8_t in[] = {1, 2, 3, 4,  5, 6,
                        7, 8, 9, 10, 11};  // 2 x 4-byte elements + 3 tail
  uint8_t out[11], back[11];
  ByteShuffle(in, out, 11, 4);
  const uint8_t expected[] = {1, 5, 2, 6, 3, 7, 4, 8, 9, 10, 11};
  EXPECT_EQ(std::memcmp(out, expected, 11), 0);
  ByteUnshuffle(out, back, 11, 4);
  EXPECT_EQ(std::memcmp(back, in, 11), 0);
  for (size_t width : {1u, 2u, 3u, 8u, 16u}) {
    ByteShuffle(in, out, 11, width);
    ByteUnshuffle(out, back, 11, width);
    EXPECT_EQ(std::memcmp(back, in, 11), 0) << "width " << width;
  }
}

// The vector paths (widths 2 and 4, 16 elements at a time) against the
// definition, byte by byte, over sizes around every multiple of a vector.
TEST(FilterTest, ShuffleMatchesTheDefinitionAtEverySize) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (size_t width : {2u, 4u, 8u}) {
    for (size_t n = 0; n < 16 * width * 5; ++n) {
      std::vector<uint8_t> in(n), out(n), back(n), expected(n);
      for (uint8_t& b : in) b = static_cast<uint8_t>(rng());
      const size_t elements = n / width;
      for (size_t i = 0; i < elements; ++i) {
        for (size_t b = 0; b < width; ++b)
          expected[b * elements + i] = in[i * width + b];
      }
      for (size_t t = elements * width; t < n; ++t) expected[t] = in[t];
      ByteShuffle(in.data(), out.data(), n, width);
      ASSERT_EQ(out, expected) << "width " << width << " n " << n;
      ByteUnshuffle(out.data(), back.data(), n, width);
      ASSERT_EQ(back, in) << "width " << width << " n " << n;
    }
  }
}

// Planes read from separate buffers (as the plane codec's raw and decoded
// planes lie) give the same bytes as ByteUnshuffle of the planes back to back,
// for every width the plane codec takes and an odd one past it.
TEST(FilterTest, UnshuffleFromScatteredPlanesMatchesUnshuffle) {
  std::mt19937_64 rng(testing::TestSeed());
  for (size_t width : {1u, 2u, 3u, 4u, 8u, 16u, 300u}) {
    for (size_t n : {size_t{0}, width - 1, 16 * width * 3 + 5, size_t{70001}}) {
      const std::vector<uint8_t> shuffled = testing::RandomBytes(rng, n);
      const size_t elements = n / width;
      std::vector<std::vector<uint8_t>> copies(width);
      std::vector<const uint8_t*> planes(width);
      for (size_t b = 0; b < width; ++b) {
        // One byte of offset so that no plane is aligned as it was.
        copies[b].assign(elements + 1, 0);
        std::memcpy(copies[b].data() + 1, shuffled.data() + b * elements,
                    elements);
        planes[b] = copies[b].data() + 1;
      }
      std::vector<uint8_t> expected(n), got(n);
      ByteUnshuffle(shuffled.data(), expected.data(), n, width);
      if (width <= 255) {
        ByteUnshufflePlanes(planes.data(), shuffled.data() + elements * width,
                            got.data(), n, width);
        ASSERT_EQ(got, expected) << "width " << width << " n " << n;
      }
      std::vector<uint8_t> back(n);
      ByteShuffle(expected.data(), back.data(), n, width);
      ASSERT_EQ(back, shuffled) << "width " << width << " n " << n;
    }
  }
}

TEST(ChunkCodecTest, CompressibleDataIsCompressedAndShuffled) {
  std::vector<uint8_t> raw(1 << 20);
  for (size_t i = 0; i < raw.size() / 4; ++i) {
    float f = static_cast<float>(i % 1000) * 0.001f;
    std::memcpy(&raw[i * 4], &f, 4);
  }
  ChunkHeader h;
  auto encoded = EncodeChunk(raw, 4, CodecOptions{}, nullptr, &h);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(h.codec, proto::CODEC_ZSTD_PLANES);
  EXPECT_EQ(h.filter, proto::FILTER_BYTE_SHUFFLE);
  EXPECT_LT(h.stored_size, raw.size() / 4);
  EXPECT_EQ(encoded->size() % kAlignment, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(encoded->head.data()) % kAlignment, 0u);
  auto parsed = DecodeChunkHeader({encoded->head.data(), kChunkHeaderSize});
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(*parsed == h);
  std::vector<uint8_t> back(raw.size());
  ASSERT_TRUE(DecodeChunk(h, Stored(*encoded, h), absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, raw);
}

TEST(ChunkCodecTest, IncompressibleDataIsStoredRaw) {
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<uint8_t> raw = testing::RandomBytes(rng, 1 << 20);
  ChunkHeader h;
  auto encoded = EncodeChunk(raw, 2, CodecOptions{}, nullptr, &h);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(h.codec, proto::CODEC_NONE);
  EXPECT_EQ(h.filter, proto::FILTER_NONE);
  EXPECT_EQ(h.stored_size, raw.size());
  EXPECT_EQ(h.raw_xxh3, h.stored_xxh3);
  std::vector<uint8_t> back(raw.size());
  ASSERT_TRUE(DecodeChunk(h, Stored(*encoded, h), absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, raw);
}

TEST(ChunkCodecTest, ZstdBombIsAnErrorNotAnAllocation) {
  // 64 MiB of zeros compress to a few KiB; a header claiming 4 KiB must not
  // inflate them.
  std::vector<uint8_t> zeros(64 << 20);
  std::vector<uint8_t> frame(ZSTD_compressBound(zeros.size()));
  size_t n =
      ZSTD_compress(frame.data(), frame.size(), zeros.data(), zeros.size(), 1);
  ASSERT_FALSE(ZSTD_isError(n));
  frame.resize(n);
  ChunkHeader h;
  h.codec = proto::CODEC_ZSTD;
  h.filter = proto::FILTER_NONE;
  h.raw_size = 4096;
  h.stored_size = static_cast<uint32_t>(n);
  h.stored_xxh3 = Checksum(frame);
  std::vector<uint8_t> out(4096);
  absl::Status s = DecodeChunk(h, frame, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("declares"));

  // The same with a frame that hides its content size (streamed): bounded by
  // raw_size.
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
  std::vector<uint8_t> hidden(ZSTD_compressBound(zeros.size()));
  n = ZSTD_compress2(cctx, hidden.data(), hidden.size(), zeros.data(),
                     zeros.size());
  ZSTD_freeCCtx(cctx);
  ASSERT_FALSE(ZSTD_isError(n));
  hidden.resize(n);
  h.stored_size = static_cast<uint32_t>(n);
  h.stored_xxh3 = Checksum(hidden);
  EXPECT_EQ(DecodeChunk(h, hidden, absl::MakeSpan(out)).code(),
            absl::StatusCode::kDataLoss);
}

TEST(ChunkCodecTest, ChecksumMismatchesAreDataLoss) {
  std::vector<uint8_t> raw(10000, 7);
  ChunkHeader h;
  auto encoded = EncodeChunk(raw, 1, CodecOptions{}, nullptr, &h);
  ASSERT_TRUE(encoded.ok());
  std::vector<uint8_t> back(raw.size());
  ChunkHeader wrong_raw = h;
  wrong_raw.raw_xxh3 ^= 1;
  EXPECT_THAT(DecodeChunk(wrong_raw, Stored(*encoded, h), absl::MakeSpan(back))
                  .message(),
              HasSubstr("raw bytes checksum"));
  encoded->head.data()[kChunkHeaderSize] ^= 0x40;
  EXPECT_THAT(
      DecodeChunk(h, Stored(*encoded, h), absl::MakeSpan(back)).message(),
      HasSubstr("stored bytes checksum"));
}

TEST(ChunkCodecTest, HeaderRejectsEveryFlippedByte) {
  ChunkHeader h;
  h.codec = proto::CODEC_ZSTD;
  h.raw_size = 4096;
  h.stored_size = 100;
  uint8_t bytes[kChunkHeaderSize];
  EncodeChunkHeader(h, bytes);
  ASSERT_TRUE(DecodeChunkHeader({bytes, kChunkHeaderSize}).ok());
  for (size_t i = 0; i < kChunkHeaderSize; ++i) {
    bytes[i] ^= 0x01;
    EXPECT_FALSE(DecodeChunkHeader({bytes, kChunkHeaderSize}).ok())
        << "byte " << i;
    bytes[i] ^= 0x01;
  }
}

TEST(ChunkCodecTest, UsesPoolBuffersWhenLargeEnough) {
  io::BufferPool pool(MaxEncodedSize(8192), 4);
  std::vector<uint8_t> raw(8192, 1);
  ChunkHeader h;
  auto first = EncodeChunk(raw, 1, CodecOptions{}, &pool, &h);
  ASSERT_TRUE(first.ok());
  const uint8_t* address = first->head.data();
  first->head = io::AlignedBuffer();  // back to the pool
  auto second = EncodeChunk(raw, 1, CodecOptions{}, &pool, &h);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->head.data(), address);
}

TEST(ChunkCodecTest, AlignedRawBytesAreStoredInPlaceWithoutACopy) {
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<uint8_t> random = testing::RandomBytes(rng, 300000);
  io::AlignedBuffer raw(random.size());  // page aligned
  std::memcpy(raw.data(), random.data(), random.size());
  ChunkHeader h;
  auto encoded = EncodeChunk(raw.span(), 4, CodecOptions{}, nullptr, &h);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(h.codec, proto::CODEC_NONE);
  EXPECT_EQ(h.version, kFormatVersion);
  EXPECT_EQ(h.stored_offset, kAlignment);
  // The header padded to the alignment; the aligned prefix borrowed from the
  // caller; the rest copied and padded.
  ASSERT_EQ(encoded->head.size(), kAlignment);
  EXPECT_EQ(encoded->body.data(), raw.data());
  EXPECT_EQ(encoded->body.size(), random.size() / kAlignment * kAlignment);
  ASSERT_EQ(encoded->tail.size(), kAlignment);
  EXPECT_EQ(encoded->size(), ChunkFootprint(kAlignment, random.size()));
  auto parsed = DecodeChunkHeader(encoded->head.span());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(*parsed == h);
  for (size_t i = kChunkHeaderSize; i < kAlignment; ++i)
    ASSERT_EQ(encoded->head.data()[i], 0) << i;
  // Reassembled as a reader sees it, it decodes to the raw bytes.
  std::vector<uint8_t> stored(encoded->body.begin(), encoded->body.end());
  stored.insert(stored.end(), encoded->tail.data(),
                encoded->tail.data() + random.size() - encoded->body.size());
  for (size_t i = random.size() - encoded->body.size(); i < kAlignment; ++i)
    ASSERT_EQ(encoded->tail.data()[i], 0) << i;
  std::vector<uint8_t> back(random.size());
  ASSERT_TRUE(DecodeChunk(h, stored, absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, random);

  // Not in place: unaligned, too small, or turned off.
  CodecOptions off;
  off.in_place = false;
  ASSERT_TRUE(EncodeChunk(raw.span(), 4, off, nullptr, &h).ok());
  EXPECT_EQ(h.stored_offset, kChunkHeaderSize);
  ASSERT_TRUE(
      EncodeChunk(raw.span().subspan(8), 4, CodecOptions{}, nullptr, &h).ok());
  EXPECT_EQ(h.stored_offset, kChunkHeaderSize);
  ASSERT_TRUE(EncodeChunk(raw.span().first(kMinInPlaceBytes - 8), 4,
                          CodecOptions{}, nullptr, &h)
                  .ok());
  EXPECT_EQ(h.stored_offset, kChunkHeaderSize);
}

TEST(ChunkCodecTest, FormatOneHeadersStillDecode) {
  ChunkHeader h;
  h.version = 1;
  h.raw_size = 4096;
  h.stored_size = 4096;
  uint8_t bytes[kChunkHeaderSize];
  EncodeChunkHeader(h, bytes);
  auto parsed = DecodeChunkHeader({bytes, kChunkHeaderSize});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->version, 1u);
  EXPECT_EQ(parsed->stored_offset, kChunkHeaderSize);
  // Version 2 allows only the two stored offsets.
  h.version = 2;
  h.stored_offset = 128;
  EncodeChunkHeader(h, bytes);
  EXPECT_THAT(DecodeChunkHeader({bytes, kChunkHeaderSize}).status().message(),
              HasSubstr("stored bytes at offset 128"));
}

}  // namespace
}  // namespace ckpt::snapshot
