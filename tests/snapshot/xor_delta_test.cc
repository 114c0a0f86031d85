// XOR deltas (format 5): changed float chunks stored as the XOR with the
// same chunk of the previous save, when that is smaller. Chains of every
// length up to the bound round-trip bit-exact for every float width; a
// flipped byte in a base or a delta is caught; base bytes that do not match
// give no delta; a chunk that changed beyond recognition is stored whole; a
// missing or replaced delta base is an error naming it; a self-contained copy
// stands alone.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "io/thread_pool.h"
#include "snapshot/dtype.h"
#include "snapshot/format.h"
#include "snapshot/self_contained.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kChunk = 16 << 10;

// A tensor as training changes it: values in double, stored in `dtype`.
struct Tensor {
  std::string name;
  proto::DType dtype;
  std::vector<double> values;
  std::vector<uint8_t> data;  // `values` in dtype

  void Encode() {
    const size_t w = DTypeSize(dtype);
    data.resize(values.size() * w);
    for (size_t i = 0; i < values.size(); ++i) {
      uint8_t* out = data.data() + i * w;
      switch (dtype) {
        case proto::DTYPE_FLOAT64:
          std::memcpy(out, &values[i], 8);
          break;
        case proto::DTYPE_FLOAT32: {
          const float f = static_cast<float>(values[i]);
          std::memcpy(out, &f, 4);
          break;
        }
        case proto::DTYPE_BFLOAT16: {
          const float f = static_cast<float>(values[i]);
          uint32_t bits;
          std::memcpy(&bits, &f, 4);
          const uint16_t top = static_cast<uint16_t>(bits >> 16);
          std::memcpy(out, &top, 2);
          break;
        }
        case proto::DTYPE_FLOAT16: {
          const _Float16 h = static_cast<_Float16>(values[i]);
          std::memcpy(out, &h, 2);
          break;
        }
        default:
          FAIL() << "not a float dtype";
      }
    }
  }
};

// A rank's state in `dtype`: weights and two moments of a few chunks each (one
// with a short last chunk).
std::vector<Tensor> State(std::mt19937_64& rng, proto::DType dtype) {
  std::normal_distribution<double> normal;
  const size_t w = DTypeSize(dtype);
  std::vector<Tensor> state = {{"w", dtype, {}, {}},
                               {"adam/m", dtype, {}, {}},
                               {"adam/v", dtype, {}, {}}};
  const size_t bytes[] = {4 * kChunk, 2 * kChunk + 1000, 3 * kChunk};
  for (size_t t = 0; t < state.size(); ++t) {
    state[t].values.resize(bytes[t] / w);
    const double scale = t == 2 ? 1e-4 : 0.02;
    for (double& v : state[t].values) v = scale * normal(rng);
    state[t].Encode();
  }
  return state;
}

// One optimizer step's worth of change in about `percent`% of the chunks:
// each value moves by a thousandth of itself, as training moves weights.
void Step(std::mt19937_64& rng, std::vector<Tensor>& state, int percent) {
  std::normal_distribution<double> normal;
  for (Tensor& t : state) {
    const size_t per_chunk = kChunk / DTypeSize(t.dtype);
    for (size_t start = 0; start < t.values.size(); start += per_chunk) {
      if (static_cast<int>(rng() % 100) >= percent) continue;
      const size_t end = std::min(t.values.size(), start + per_chunk);
      for (size_t i = start; i < end; ++i)
        t.values[i] *= 1 + 1e-3 * normal(rng);
    }
    t.Encode();
  }
}

struct Saved {
  std::shared_ptr<ShardBase> base;  // for the next save
  proto::ShardManifest manifest;
  ShardWriteStats stats;
};

// Saves `state` as step `step` over `base`, whose raw bytes are `base_state`
// (or what `read_raw` gives, when set).
Saved Save(const std::string& path, uint64_t step,
           const std::vector<Tensor>& state, std::shared_ptr<ShardBase> base,
           const std::vector<Tensor>* base_state,
           ReadBaseRaw read_raw = nullptr, uint32_t max_depth = 4,
           uint32_t format_version = kFormatVersion) {
  ShardWriterOptions options;
  options.chunk_size = kChunk;
  options.max_delta_depth = max_depth;
  options.codec.format_version = format_version;
  options.encode_threads = 2;
  if (base != nullptr) {
    auto with_raw = std::make_shared<ShardBase>(*base);
    with_raw->read_raw = read_raw;
    if (!read_raw && base_state != nullptr) {
      with_raw->read_raw = [base_state](uint32_t item, uint64_t offset,
                                        absl::Span<uint8_t> out) {
        std::memcpy(out.data(), (*base_state)[item].data.data() + offset,
                    out.size());
        return absl::OkStatus();
      };
    }
    options.base = with_raw;
  }
  ShardWriter writer(io::DefaultFileSystem(), path, {"job", step, 0, 1},
                     options);
  for (const Tensor& t : state) {
    const int64_t n = static_cast<int64_t>(t.values.size());
    EXPECT_TRUE(
        writer.AddTensor({t.name, t.dtype, {n}, {0}, {n}, t.data}).ok());
  }
  absl::StatusOr<proto::ShardManifest> m = writer.Commit();
  EXPECT_TRUE(m.ok()) << m.status();
  Saved saved;
  saved.base = std::make_shared<ShardBase>();
  saved.base->manifest = *m;
  saved.base->manifest_xxh3 = writer.manifest_xxh3();
  saved.manifest = *m;
  saved.stats = writer.stats();
  return saved;
}

void ExpectReadsBack(const std::string& path,
                     const std::vector<Tensor>& state) {
  absl::StatusOr<std::unique_ptr<ShardReader>> reader =
      ShardReader::Open(io::DefaultFileSystem(), path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const Tensor& t : state) {
    std::vector<uint8_t> out(t.data.size());
    absl::Status s = (*reader)->ReadItem(t.name, absl::MakeSpan(out));
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(out == t.data) << path << " " << t.name;
    // A range across a chunk boundary.
    const size_t at = kChunk - 100, n = std::min<size_t>(300, t.data.size());
    std::vector<uint8_t> range(n);
    ASSERT_TRUE(
        (*reader)->ReadItemRange(t.name, at, absl::MakeSpan(range)).ok());
    ASSERT_TRUE(std::equal(range.begin(), range.end(), t.data.begin() + at));
  }
  EXPECT_THAT((*reader)->VerifyAll(), ::testing::IsEmpty()) << path;
}

std::string PathOf(const testing::TempDir& dir, uint64_t step) {
  return dir.File(ShardFileName(step, 0, ".shard"));
}

size_t Deltas(const proto::ShardManifest& m) {
  size_t n = 0;
  for (const proto::Item& item : m.items())
    for (const proto::ChunkInfo& c : item.chunks()) n += c.xor_base() > 0;
  return n;
}

TEST(XorDeltaTest, ChainsOfEveryFloatWidthRoundTripBitExact) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  constexpr int kBound = 10;  // the daemon's default --full-every
  for (proto::DType dtype : {proto::DTYPE_FLOAT16, proto::DTYPE_BFLOAT16,
                             proto::DTYPE_FLOAT32, proto::DTYPE_FLOAT64}) {
    SCOPED_TRACE(DTypeName(dtype));
    testing::TempDir dir, elsewhere;
    std::vector<std::vector<Tensor>> saved;
    saved.reserve(kBound);  // the writer reads the previous state by pointer
    saved.push_back(State(rng, dtype));
    Saved last = Save(PathOf(dir, 1), 1, saved.back(), nullptr, nullptr);
    EXPECT_EQ(Deltas(last.manifest), 0u);  // a full save has no deltas
    size_t deltas = 0;
    for (int s = 1; s < kBound; ++s) {
      std::vector<Tensor> next = saved.back();
      Step(rng, next, static_cast<int>(rng() % 101));
      saved.push_back(std::move(next));
      const uint64_t step = static_cast<uint64_t>(s + 1);
      last = Save(PathOf(dir, step), step, saved.back(), last.base,
                  &saved[saved.size() - 2]);
      EXPECT_EQ(last.manifest.increments(), static_cast<uint32_t>(s));
      deltas += last.stats.deltas;
    }
    EXPECT_GT(deltas, 0u) << "seed " << seed;
    EXPECT_GT(Deltas(last.manifest), 0u) << "seed " << seed;
    for (size_t s = 0; s < saved.size(); ++s)
      ExpectReadsBack(PathOf(dir, s + 1), saved[s]);
    // The last save as one file alone (a peer's replica): deltas stored whole.
    absl::StatusOr<SelfContained> view =
        OpenSelfContained(io::DefaultFileSystem(), PathOf(dir, kBound));
    ASSERT_TRUE(view.ok()) << view.status();
    std::string bytes(view->size, '\0');
    ASSERT_TRUE(
        view->file
            ->Read(0, absl::MakeSpan(reinterpret_cast<uint8_t*>(bytes.data()),
                                     bytes.size()))
            .ok());
    const std::string copy = elsewhere.File(ShardFileName(kBound, 0, ".ckpt"));
    testing::WriteAll(copy, bytes);
    ExpectReadsBack(copy, saved.back());
    auto reader = ShardReader::Open(io::DefaultFileSystem(), copy);
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ((*reader)->manifest().bases_size(), 0);
    EXPECT_EQ(Deltas((*reader)->manifest()), 0u);
  }
}

TEST(XorDeltaTest, ChainsOfDeltasStopAtTheirDepthBound) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  std::vector<std::vector<Tensor>> saved;
  saved.reserve(8);
  saved.push_back(State(rng, proto::DTYPE_BFLOAT16));
  Saved last = Save(PathOf(dir, 1), 1, saved.back(), nullptr, nullptr);
  for (uint64_t step = 2; step <= 8; ++step) {
    saved.push_back(saved.back());
    Step(rng, saved.back(), 100);
    last = Save(PathOf(dir, step), step, saved.back(), last.base,
                &saved[saved.size() - 2], nullptr, /*max_depth=*/2);
    // Depths 1, 2, then stored as it is (0), 1, 2, 0, ...: a read decodes
    // at most two deltas.
    const uint32_t expected = static_cast<uint32_t>((step - 1) % 3);
    for (const proto::Item& item : last.manifest.items()) {
      for (const proto::ChunkInfo& c : item.chunks()) {
        if (expected == 0 || c.xor_base() > 0)
          EXPECT_EQ(c.xor_depth(), expected) << "step " << step;
      }
    }
    if (expected > 0) EXPECT_GT(Deltas(last.manifest), 0u) << "step " << step;
  }
  for (size_t s = 0; s < saved.size(); ++s)
    ExpectReadsBack(PathOf(dir, s + 1), saved[s]);
}

TEST(XorDeltaTest, AFlippedByteInABaseOrADeltaIsCaught) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  testing::TempDir dir;
  std::vector<std::vector<Tensor>> saved;
  saved.reserve(3);
  saved.push_back(State(rng, proto::DTYPE_BFLOAT16));
  saved[0].resize(1);  // "w" only: four chunks
  Saved s1 = Save(PathOf(dir, 1), 1, saved[0], nullptr, nullptr);
  saved.push_back(saved[0]);
  Step(rng, saved[1], 100);
  Saved s2 = Save(PathOf(dir, 2), 2, saved[1], s1.base, &saved[0]);
  saved.push_back(saved[1]);
  Step(rng, saved[2], 50);
  Saved s3 = Save(PathOf(dir, 3), 3, saved[2], s2.base, &saved[1]);
  ASSERT_EQ(Deltas(s2.manifest), 4u) << "seed " << seed;
  ASSERT_GT(Deltas(s3.manifest), 0u) << "seed " << seed;
  io::ThreadPool pool(1);
  ShardReaderOptions fast;
  fast.direct_io = false;
  fast.pool = &pool;
  const std::vector<std::string> paths = {PathOf(dir, 1), PathOf(dir, 2),
                                          PathOf(dir, 3)};
  auto last_errors = [&] {
    return VerifyShard(io::DefaultFileSystem(), paths[2], fast);
  };
  ASSERT_THAT(last_errors(), ::testing::IsEmpty());
  // Bytes throughout every chunk step 3 reads (its own, its delta bases', the
  // chunks it left in them; one every 1 to 7 bytes, at random), each flipped
  // once: step 3 alone no longer verifies.
  size_t flips = 0;
  for (const std::string& p : paths) {
    auto reader = ShardReader::Open(io::DefaultFileSystem(), p);
    ASSERT_TRUE(reader.ok());
    const uint64_t data_end = (*reader)->manifest().data_size();
    const int fd = ::open(p.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    for (uint64_t at = 0; at < data_end; at += 1 + rng() % 7) {
      const char mask = static_cast<char>(1 << (at % 8));
      auto flip = [&] {
        char c;
        ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(at)), 1);
        c ^= mask;
        ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(at)), 1);
      };
      flip();
      ASSERT_FALSE(last_errors().empty())
          << "flip at byte " << at << " of " << p << ", seed " << seed;
      flip();
      ++flips;
    }
    ::close(fd);
  }
  ASSERT_THAT(last_errors(), ::testing::IsEmpty());
  EXPECT_GT(flips, 5000u);
}

TEST(XorDeltaTest, BaseBytesThatDoNotMatchGiveNoDelta) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  std::vector<Tensor> before = State(rng, proto::DTYPE_FLOAT32);
  Saved s1 = Save(PathOf(dir, 1), 1, before, nullptr, nullptr);
  std::vector<Tensor> after = before;
  Step(rng, after, 100);
  // The base's slot was reused since (other bytes), or cannot be read.
  std::vector<Tensor> other = State(rng, proto::DTYPE_FLOAT32);
  Saved s2 = Save(PathOf(dir, 2), 2, after, s1.base, &other);
  EXPECT_EQ(s2.stats.deltas, 0u);
  ExpectReadsBack(PathOf(dir, 2), after);
  Saved s3 = Save(PathOf(dir, 3), 3, after, s1.base, nullptr,
                  [](uint32_t, uint64_t, absl::Span<uint8_t>) {
                    return absl::UnavailableError("slot gone");
                  });
  EXPECT_EQ(s3.stats.deltas, 0u);
  ExpectReadsBack(PathOf(dir, 3), after);
  // With the right bytes, the same save is made of deltas.
  Saved s4 = Save(PathOf(dir, 4), 4, after, s1.base, &before);
  EXPECT_GT(s4.stats.deltas, 0u);
  ExpectReadsBack(PathOf(dir, 4), after);
}

TEST(XorDeltaTest, AChunkIsStoredAsADeltaOnlyWhenThatIsSmaller) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  std::vector<Tensor> before = State(rng, proto::DTYPE_FLOAT32);
  Saved s1 = Save(PathOf(dir, 1), 1, before, nullptr, nullptr);
  std::vector<Tensor> after = before;
  Step(rng, after, 100);
  // "w" re-initialized: new values of another scale share nothing with the
  // old ones; their XOR codes worse than they do.
  std::normal_distribution<double> normal;
  for (double& v : after[0].values) v = 50 * normal(rng);
  after[0].Encode();
  Saved s2 = Save(PathOf(dir, 2), 2, after, s1.base, &before);
  for (const proto::ChunkInfo& c : s2.manifest.items(0).chunks())
    EXPECT_EQ(c.xor_base(), 0u);
  for (int i : {1, 2})
    for (const proto::ChunkInfo& c : s2.manifest.items(i).chunks())
      EXPECT_GT(c.xor_base(), 0u) << s2.manifest.items(i).name();
  ExpectReadsBack(PathOf(dir, 2), after);
  // Byte items and integer tensors are never deltas.
  ShardWriterOptions options;
  options.chunk_size = kChunk;
  auto base = std::make_shared<ShardBase>(*s1.base);
  base->read_raw = [](uint32_t, uint64_t, absl::Span<uint8_t>) {
    ADD_FAILURE() << "asked for base bytes of a chunk that is not float";
    return absl::OkStatus();
  };
  options.base = base;
  ShardWriter writer(io::DefaultFileSystem(), PathOf(dir, 3), {"job", 3, 0, 1},
                     options);
  ASSERT_TRUE(writer.AddBytes("w", after[0].data).ok());
  ASSERT_TRUE(writer.Commit().ok());
  EXPECT_EQ(writer.stats().deltas, 0u);
}

TEST(XorDeltaTest, AMissingOrReplacedDeltaBaseIsReportedPrecisely) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  std::vector<Tensor> before = State(rng, proto::DTYPE_BFLOAT16);
  Saved s1 = Save(PathOf(dir, 1), 1, before, nullptr, nullptr);
  const std::string bytes1 = testing::ReadAll(PathOf(dir, 1));
  std::vector<Tensor> after = before;
  Step(rng, after, 100);
  Saved s2 = Save(PathOf(dir, 2), 2, after, s1.base, &before);
  ASSERT_GT(s2.stats.deltas, 0u);

  // Step 1 saved again (another file under its name).
  Save(PathOf(dir, 1), 1, State(rng, proto::DTYPE_BFLOAT16), nullptr, nullptr);
  auto reader = ShardReader::Open(io::DefaultFileSystem(), PathOf(dir, 2));
  ASSERT_TRUE(reader.ok());
  std::vector<uint8_t> out(after[0].data.size());
  absl::Status s = (*reader)->ReadItem("w", absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("XOR deltas against"));
  EXPECT_THAT(s.message(), HasSubstr("step 1"));
  EXPECT_THAT(s.message(),
              HasSubstr("is not the shard this one was saved against"));
  EXPECT_THAT(s.message(), HasSubstr("item \"w\""));

  ASSERT_EQ(std::remove(PathOf(dir, 1).c_str()), 0);
  std::vector<absl::Status> errors =
      VerifyShard(io::DefaultFileSystem(), PathOf(dir, 2));
  ASSERT_FALSE(errors.empty());
  EXPECT_THAT(errors[0].message(), HasSubstr("step 1"));

  testing::WriteAll(PathOf(dir, 1), bytes1);
  ExpectReadsBack(PathOf(dir, 2), after);
}

TEST(XorDeltaTest, AFormatFourWriterStoresNoDeltas) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  std::vector<Tensor> before = State(rng, proto::DTYPE_FLOAT32);
  Saved s1 = Save(PathOf(dir, 1), 1, before, nullptr, nullptr, nullptr, 4, 4);
  std::vector<Tensor> after = before;
  Step(rng, after, 100);
  Saved s2 = Save(PathOf(dir, 2), 2, after, s1.base, &before, nullptr, 4, 4);
  EXPECT_EQ(s2.stats.deltas, 0u);
  EXPECT_EQ(s2.manifest.format_version(), 4u);
  ExpectReadsBack(PathOf(dir, 2), after);
}

// What a manifest says of its deltas is checked before anything is read: a
// delta against no base, of depth 0 or deeper than the increments, a delta
// checksum or depth on a chunk that is none, or a delta in format 4.
TEST(XorDeltaTest, AManifestLyingAboutItsDeltasIsRefused) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  std::vector<Tensor> before = State(rng, proto::DTYPE_FLOAT32);
  Saved s1 = Save(PathOf(dir, 1), 1, before, nullptr, nullptr);
  std::vector<Tensor> after = before;
  Step(rng, after, 100);
  Saved s2 = Save(PathOf(dir, 2), 2, after, s1.base, &before);
  const proto::ShardManifest& good = s2.manifest;
  ASSERT_TRUE(ValidateManifest(good, good.data_size()).ok());
  int item = -1, chunk = -1;
  for (int i = 0; i < good.items_size() && item < 0; ++i)
    for (int c = 0; c < good.items(i).chunks_size() && item < 0; ++c)
      if (good.items(i).chunks(c).xor_base() > 0) item = i, chunk = c;
  ASSERT_GE(item, 0);
  auto lie = [&](auto mutate) {
    proto::ShardManifest m = good;
    mutate(*m.mutable_items(item)->mutable_chunks(chunk), m);
    return ValidateManifest(m, m.data_size());
  };
  using C = proto::ChunkInfo;
  using M = proto::ShardManifest;
  for (absl::Status s : {
           lie([](C&c, M&) { c.set_xor_base(7); }),
           lie([](C&c, M&) { c.set_xor_depth(0); }),
           lie([](C&c, M&m) { c.set_xor_depth(m.increments() + 1); }),
           lie([](C&c, M&) {
             c.set_xor_base(0);  // its checksum and depth stay
           }),
           lie([](C&, M&m) { m.set_format_version(4); }),
       }) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  }
}

}  // namespace
}  // namespace ckpt::snapshot
