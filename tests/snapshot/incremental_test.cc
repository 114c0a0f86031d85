// Incremental shards (format 3): chains of saves where each stores only the
// chunks that changed since the previous one. Round trips over chains of
// every length up to the bound with random changed subsets and dtypes; every
// single-byte flip in a base or an increment detected; a missing or replaced
// base reported precisely; bases the writer must not use.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "io/thread_pool.h"
#include "snapshot/dtype.h"
#include "snapshot/self_contained.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kChunk = 4096;

struct Tensor {
  std::string name;
  proto::DType dtype;
  std::vector<uint8_t> data;
};

// A rank's training state: a few tensors of different dtypes and sizes (some
// of one chunk, some of many, one with a short last chunk) and a byte item.
std::vector<Tensor> State(std::mt19937_64& rng) {
  std::vector<Tensor> state = {{"w/fp32", proto::DTYPE_FLOAT32, {}},
                               {"w/bf16", proto::DTYPE_BFLOAT16, {}},
                               {"adam/m", proto::DTYPE_FLOAT32, {}},
                               {"step/i64", proto::DTYPE_INT64, {}},
                               {"extra", proto::DTYPE_UNSPECIFIED, {}}};
  const size_t bytes[] = {5 * kChunk, 3 * kChunk + 1000, 4 * kChunk, 64, 3000};
  for (size_t i = 0; i < state.size(); ++i)
    state[i].data = testing::RandomBytes(rng, bytes[i]);
  return state;
}

size_t ChunksOf(const Tensor& t) {
  return (t.data.size() + kChunk - 1) / kChunk;
}

// Writes `state` as step `step`, over `base` when given. Returns the base the
// next save may use.
std::shared_ptr<ShardBase> Save(const std::string& path, uint64_t step,
                                const std::vector<Tensor>& state,
                                std::shared_ptr<const ShardBase> base,
                                proto::ShardManifest* manifest_out = nullptr) {
  ShardWriterOptions options;
  options.chunk_size = kChunk;
  options.encode_threads = 2;
  options.base = std::move(base);
  ShardWriter writer(io::DefaultFileSystem(), path, {"job", step, 0, 1},
                     options);
  for (const Tensor& t : state) {
    if (t.dtype == proto::DTYPE_UNSPECIFIED) {
      EXPECT_TRUE(writer.AddBytes(t.name, t.data).ok());
      continue;
    }
    const int64_t n = static_cast<int64_t>(t.data.size() / DTypeSize(t.dtype));
    EXPECT_TRUE(
        writer.AddTensor({t.name, t.dtype, {n}, {0}, {n}, t.data}).ok());
  }
  absl::StatusOr<proto::ShardManifest> m = writer.Commit();
  EXPECT_TRUE(m.ok()) << m.status();
  auto next = std::make_shared<ShardBase>();
  next->manifest = *m;
  next->manifest_xxh3 = writer.manifest_xxh3();
  if (manifest_out != nullptr) *manifest_out = *m;
  return next;
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
    ASSERT_EQ(out, t.data) << path << " " << t.name;
  }
  EXPECT_THAT((*reader)->VerifyAll(), ::testing::IsEmpty()) << path;
}

std::string PathOf(const testing::TempDir& dir, uint64_t step) {
  return dir.File(ShardFileName(step, 0, ".shard"));
}

TEST(IncrementalTest, ChainsOfEveryLengthRoundTripAndStoreOnlyWhatChanged) {
  std::mt19937_64 rng(testing::TestSeed());
  constexpr int kBound = 10;  // the daemon's default --full-every
  for (int length = 1; length <= kBound; ++length) {
    testing::TempDir dir;
    std::vector<Tensor> state = State(rng);
    std::vector<std::vector<Tensor>> saved;
    std::shared_ptr<ShardBase> base;
    uint32_t increments = 0;
    for (int s = 0; s < length; ++s) {
      const uint64_t step = 10 * (s + 1);
      // Change a random subset of chunks (none, some or all).
      std::set<std::pair<size_t, size_t>> changed;
      const int percent = static_cast<int>(rng() % 101);
      for (size_t i = 0; s > 0 && i < state.size(); ++i) {
        for (size_t c = 0; c < ChunksOf(state[i]); ++c) {
          if (static_cast<int>(rng() % 100) >= percent) continue;
          const size_t at =
              c * kChunk +
              rng() %
                  std::min<size_t>(kChunk, state[i].data.size() - c * kChunk);
          state[i].data[at] ^= 1 + rng() % 255;
          changed.insert({i, c});
        }
      }
      proto::ShardManifest m;
      base = Save(PathOf(dir, step), step, state, base, &m);
      saved.push_back(state);
      // Exactly the changed chunks are stored here; the others where they lie.
      size_t here = 0, total = 0;
      for (const proto::Item& item : m.items())
        for (const proto::ChunkInfo& c : item.chunks()) {
          ++total;
          here += c.base() == 0;
        }
      if (s == 0) {
        EXPECT_EQ(here, total);
        EXPECT_EQ(m.increments(), 0u);
        EXPECT_EQ(m.bases_size(), 0);
      } else {
        EXPECT_EQ(here, changed.size()) << "step " << step;
        // A save that changed every chunk is a full one; the chain restarts.
        increments = here == total ? 0 : increments + 1;
        EXPECT_EQ(m.increments(), increments) << "step " << step;
      }
      for (const proto::BaseShard& b : m.bases()) EXPECT_LT(b.step(), step);
    }
    // Every step of the chain reads back exactly what it saved.
    for (int s = 0; s < length; ++s)
      ExpectReadsBack(PathOf(dir, 10 * (s + 1)), saved[s]);
  }
}

TEST(IncrementalTest, RangeReadsAcrossChunksOfBaseAndIncrement) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  std::vector<Tensor> state = State(rng);
  auto base = Save(PathOf(dir, 1), 1, state, nullptr);
  state[0].data[kChunk + 7] ^= 0xff;  // chunk 1 of w/fp32 changes
  Save(PathOf(dir, 2), 2, state, base);
  auto reader = ShardReader::Open(io::DefaultFileSystem(), PathOf(dir, 2));
  ASSERT_TRUE(reader.ok()) << reader.status();
  // Bytes from chunk 0 (in the base) through chunk 2 (in the base), across the
  // changed chunk 1 (here).
  std::vector<uint8_t> out(2 * kChunk);
  ASSERT_TRUE(
      (*reader)->ReadItemRange("w/fp32", 100, absl::MakeSpan(out)).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), state[0].data.begin() + 100));
}

TEST(IncrementalTest, EverySingleByteFlipInABaseOrAnIncrementIsDetected) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  // Small: every byte of three files is flipped once.
  std::vector<Tensor> state = {
      {"a", proto::DTYPE_FLOAT32, testing::RandomBytes(rng, 2 * kChunk)},
      {"b", proto::DTYPE_UNSPECIFIED, testing::RandomBytes(rng, 1500)}};
  std::vector<std::string> paths = {PathOf(dir, 1), PathOf(dir, 2),
                                    PathOf(dir, 3)};
  auto b1 = Save(paths[0], 1, state, nullptr);
  state[0].data[5] ^= 1;  // a's chunk 0 changes; chunk 1 and b stay in 1
  auto b2 = Save(paths[1], 2, state, b1);
  state[1].data[5] ^= 1;  // b changes; a's chunk 0 stays in 2, chunk 1 in 1
  Save(paths[2], 3, state, b2);
  {
    auto r3 = ShardReader::Open(io::DefaultFileSystem(), paths[2]);
    ASSERT_TRUE(r3.ok());
    ASSERT_EQ((*r3)->manifest().bases_size(), 2);
  }
  io::ThreadPool pool(1);
  ShardReaderOptions fast;
  fast.direct_io = false;
  fast.pool = &pool;
  auto chain_errors = [&] {
    size_t n = 0;
    for (const std::string& p : paths)
      n += VerifyShard(io::DefaultFileSystem(), p, fast).size();
    return n;
  };
  ASSERT_EQ(chain_errors(), 0u);
  size_t flips = 0;
  for (const std::string& p : paths) {
    const size_t size = testing::ReadAll(p).size();
    const int fd = ::open(p.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    for (size_t at = 0; at < size; ++at) {
      const char mask = static_cast<char>(1 << (at % 8));
      auto flip = [&] {
        char c;
        ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(at)), 1);
        c ^= mask;
        ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(at)), 1);
      };
      flip();
      ASSERT_GT(chain_errors(), 0u) << "flip at byte " << at << " of " << p;
      flip();
      ++flips;
    }
    ::close(fd);
  }
  ASSERT_EQ(chain_errors(), 0u);
  EXPECT_GT(flips, 40000u);
  // And a flip in a chunk the last step stores in a base shows when the last
  // step alone is verified.
  std::string first = testing::ReadAll(paths[0]);
  auto r1 = ShardReader::Open(io::DefaultFileSystem(), paths[0]);
  ASSERT_TRUE(r1.ok());
  const uint64_t a1 = (*r1)->manifest().items(0).chunks(1).file_offset();
  std::string flipped = first;
  flipped[a1 + 64 + 100] ^= 4;
  testing::WriteAll(paths[0], flipped);
  std::vector<absl::Status> errors =
      VerifyShard(io::DefaultFileSystem(), paths[2]);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0].message(),
              HasSubstr("item \"a\" chunk 1 (stored in base shard step 1"));
}

TEST(IncrementalTest, AMissingOrReplacedBaseIsReportedPrecisely) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  std::vector<Tensor> state = State(rng);
  auto base = Save(PathOf(dir, 7), 7, state, nullptr);
  state[1].data[0] ^= 1;  // only w/bf16's first chunk changes
  Save(PathOf(dir, 8), 8, state, base);
  const std::string bytes7 = testing::ReadAll(PathOf(dir, 7));

  ASSERT_EQ(std::remove(PathOf(dir, 7).c_str()), 0);
  std::vector<absl::Status> errors =
      VerifyShard(io::DefaultFileSystem(), PathOf(dir, 8));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0].message(), HasSubstr("base shard step 7"));
  EXPECT_THAT(errors[0].message(), HasSubstr(PathOf(dir, 7)));
  EXPECT_THAT(errors[0].message(), HasSubstr("is missing"));
  EXPECT_THAT(errors[0].message(), HasSubstr("\"adam/m\""));
  // What lies in the increment itself still reads; what lies in the base is
  // an error naming it.
  auto reader = ShardReader::Open(io::DefaultFileSystem(), PathOf(dir, 8));
  ASSERT_TRUE(reader.ok());
  std::vector<uint8_t> out(kChunk);
  EXPECT_TRUE((*reader)->ReadItemRange("w/bf16", 0, absl::MakeSpan(out)).ok());
  std::vector<uint8_t> whole(state[0].data.size());
  absl::Status s = (*reader)->ReadItem("w/fp32", absl::MakeSpan(whole));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("base shard step 7"));

  // Another shard under the base's name (step 7 saved again) is refused.
  std::vector<Tensor> other = State(rng);
  Save(PathOf(dir, 7), 7, other, nullptr);
  errors = VerifyShard(io::DefaultFileSystem(), PathOf(dir, 8));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0].message(),
              HasSubstr("is not the shard this one was saved against"));
  testing::WriteAll(PathOf(dir, 7), bytes7);
  EXPECT_THAT(VerifyShard(io::DefaultFileSystem(), PathOf(dir, 8)),
              ::testing::IsEmpty());
}

TEST(IncrementalTest, ABaseThatDoesNotMatchIsNotUsed) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir;
  std::vector<Tensor> state = State(rng);
  auto base = Save(PathOf(dir, 1), 1, state, nullptr);
  proto::ShardManifest m;
  // A tensor renamed, one reshaped (other dtype, same bytes): stored here.
  std::vector<Tensor> changed = state;
  changed[0].name = "w/renamed";
  changed[2].dtype = proto::DTYPE_INT32;
  Save(PathOf(dir, 2), 2, changed, base, &m);
  for (int i : {0, 2})
    for (const proto::ChunkInfo& c : m.items(i).chunks())
      EXPECT_EQ(c.base(), 0u);
  EXPECT_GT(m.items(1).chunks(0).base(), 0u);  // the untouched one is shared
  ExpectReadsBack(PathOf(dir, 2), changed);
  // A base of a later step, or of another rank, is not used at all.
  Save(PathOf(dir, 0), 0, state, base, &m);
  EXPECT_EQ(m.bases_size(), 0);
  ShardWriterOptions options;
  options.chunk_size = kChunk;
  options.base = base;
  ShardWriter other_rank(io::DefaultFileSystem(),
                         dir.File(ShardFileName(3, 1, ".shard")),
                         {"job", 3, 1, 2}, options);
  ASSERT_TRUE(other_rank.AddBytes("extra", state[4].data).ok());
  absl::StatusOr<proto::ShardManifest> r = other_rank.Commit();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->bases_size(), 0);
}

TEST(IncrementalTest, ASelfContainedViewStandsAloneAndReadsAtAnyOffset) {
  std::mt19937_64 rng(testing::TestSeed());
  testing::TempDir dir, elsewhere;
  std::vector<Tensor> state = State(rng);
  auto b1 = Save(PathOf(dir, 1), 1, state, nullptr);
  state[0].data[3 * kChunk] ^= 1;
  auto b2 = Save(PathOf(dir, 2), 2, state, b1);
  state[4].data[0] ^= 1;
  Save(PathOf(dir, 3), 3, state, b2);

  absl::StatusOr<SelfContained> view =
      OpenSelfContained(io::DefaultFileSystem(), PathOf(dir, 3));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->incremental);
  std::vector<uint8_t> whole(view->size);
  ASSERT_TRUE(view->file->Read(0, absl::MakeSpan(whole)).ok());
  // Pieces at odd offsets and sizes read the same bytes.
  for (uint64_t at = 0; at < view->size;) {
    const size_t n = std::min<uint64_t>(1 + rng() % 9000, view->size - at);
    std::vector<uint8_t> piece(n);
    ASSERT_TRUE(view->file->Read(at, absl::MakeSpan(piece)).ok());
    ASSERT_TRUE(std::equal(piece.begin(), piece.end(), whole.begin() + at))
        << "at " << at;
    at += n;
  }
  EXPECT_FALSE(
      view->file->Read(view->size - 10, absl::MakeSpan(whole).first(11)).ok());
  // Alone in another directory (a peer's replica), it is a full shard.
  const std::string copy = elsewhere.File(ShardFileName(3, 0, ".ckpt"));
  testing::WriteAll(copy, std::string(whole.begin(), whole.end()));
  ExpectReadsBack(copy, state);
  auto reader = ShardReader::Open(io::DefaultFileSystem(), copy);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->manifest().bases_size(), 0);
  EXPECT_EQ((*reader)->manifest_bytes(), view->manifest_bytes);
  // A shard with no bases is its own file.
  absl::StatusOr<SelfContained> full =
      OpenSelfContained(io::DefaultFileSystem(), PathOf(dir, 1));
  ASSERT_TRUE(full.ok());
  EXPECT_FALSE(full->incremental);
  EXPECT_EQ(full->size, testing::ReadAll(PathOf(dir, 1)).size());
  // Without its base, the view cannot be made, and says why.
  ASSERT_EQ(std::remove(PathOf(dir, 1).c_str()), 0);
  view = OpenSelfContained(io::DefaultFileSystem(), PathOf(dir, 3));
  ASSERT_FALSE(view.ok());
  EXPECT_THAT(view.status().message(), HasSubstr("base shard step 1"));
}

TEST(IncrementalTest, SiblingPathsFollowTheShardNames) {
  EXPECT_EQ(ShardFileName(12, 3, ".ckpt"),
            "00000000000000000012-0000000003.ckpt");
  absl::StatusOr<std::string> p =
      SiblingShardPath("/d/j/00000000000000000012-0000000003.shard", 5);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "/d/j/00000000000000000005-0000000003.shard");
  EXPECT_FALSE(SiblingShardPath("/d/j/model.shard", 5).ok());
}

}  // namespace
}  // namespace ckpt::snapshot
