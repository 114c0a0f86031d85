// ReplicaStore: a replica counts only when complete and verified, a transfer
// cut short leaves nothing, the budget holds, and a restart keeps the complete
// files and drops the partial ones.
#include "daemon/peer/replica_store.h"

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/names.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

// A real shard file of job "j" and its bytes.
std::string ShardBytes(const testing::TempDir& dir, uint64_t step,
                       uint32_t rank, size_t n = 300000) {
  const std::string path =
      dir.File("src-" + std::to_string(step) + "-" + std::to_string(rank));
  snapshot::ShardWriter writer(io::DefaultFileSystem(), path,
                               {"j", step, rank, 4}, {});
  std::vector<uint8_t> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<uint8_t>(i * 7 + step);
  EXPECT_TRUE(writer.AddBytes("state", data).ok());
  EXPECT_TRUE(writer.Commit().ok());
  return testing::ReadAll(path);
}

absl::Status Send(ReplicaStore* store, const ReplicaStore::Key& key,
                  const std::string& bytes) {
  auto rx = store->Receive(key, bytes.size());
  if (!rx.ok()) return rx.status();
  for (size_t at = 0; at < bytes.size(); at += 65536) {
    absl::Status s = (*rx)->Append(absl::string_view(bytes).substr(at, 65536));
    if (!s.ok()) return s;
  }
  return (*rx)->Finish().status();
}

TEST(ReplicaStoreTest, KeepsVerifiedFilesAndTheirRecords) {
  testing::TempDir dir;
  auto store =
      ReplicaStore::Open(io::DefaultFileSystem(), dir.File("held"), 64 << 20);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string bytes = ShardBytes(dir, 5, 2);
  ASSERT_TRUE(Send(store->get(), {"j", 5, 2}, bytes).ok());
  auto e = (*store)->Find({"j", 5, 2});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->bytes, bytes.size());
  EXPECT_EQ(testing::ReadAll(e->path), bytes);
  EXPECT_EQ((*store)->used_bytes(), bytes.size());
  auto record = ReplicaStore::RecordOf(io::DefaultFileSystem(), *e);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->state(), proto::SHARD_PERSISTED);
  EXPECT_EQ(record->world_size(), 4u);
  ASSERT_EQ(record->items_size(), 1);
  EXPECT_EQ(record->items(0).item().name(), "state");
  EXPECT_EQ(record->items(0).item().chunks_size(), 0);
  // Sending it again replaces it without counting twice.
  ASSERT_TRUE(Send(store->get(), {"j", 5, 2}, bytes).ok());
  EXPECT_EQ((*store)->used_bytes(), bytes.size());
  ASSERT_TRUE((*store)->Drop({"j", 5, 2}).ok());
  EXPECT_EQ((*store)->used_bytes(), 0u);
  EXPECT_TRUE(absl::IsNotFound((*store)->Drop({"j", 5, 2})));
}

// A file rebuilt from parity arrives segment by segment, out of order, from
// two decoding threads, written at its offsets rather than through a mapping.
TEST(ReplicaStoreTest, AFileWrittenAtOffsetsFromThreadsIsCheckedAndKept) {
  testing::TempDir dir;
  auto store = ReplicaStore::Open(io::DefaultFileSystem(), dir.File("fetched"),
                                  64 << 20);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string bytes = ShardBytes(dir, 7, 1, 1 << 20);
  const absl::Span<const uint8_t> all(
      reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  constexpr size_t kSegment = 512;
  {
    auto rx = (*store)->Receive({"j", 7, 1}, bytes.size(), /*mapped=*/false);
    ASSERT_TRUE(rx.ok()) << rx.status();
    EXPECT_TRUE((*rx)->Unfilled().empty());
    EXPECT_TRUE(absl::IsFailedPrecondition((*rx)->Append("x")));
    EXPECT_TRUE(absl::IsInvalidArgument(
        (*rx)->WriteAt(bytes.size() - 1, all.subspan(0, 2))));
    // Odd segments on one thread, even ones on another, from the end back.
    auto write = [&](size_t parity) {
      const size_t segments = (bytes.size() + kSegment - 1) / kSegment;
      for (size_t i = segments; i-- > 0;) {
        if (i % 2 != parity) continue;
        ASSERT_TRUE(
            (*rx)
                ->WriteAt(i * kSegment, all.subspan(i * kSegment, kSegment))
                .ok());
      }
    };
    std::thread odd(write, 1);
    write(0);
    odd.join();
    auto kept = (*rx)->Finish();
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(testing::ReadAll(kept->path), bytes);
    EXPECT_GT(bytes.size(), 8 * kSegment);
  }
  // One segment short: nothing is kept, and the budget is given back.
  {
    auto rx = (*store)->Receive({"j", 7, 2}, bytes.size(), /*mapped=*/false);
    ASSERT_TRUE(rx.ok()) << rx.status();
    ASSERT_TRUE((*rx)->WriteAt(0, all.subspan(0, bytes.size() - 1)).ok());
    auto kept = (*rx)->Finish();
    ASSERT_FALSE(kept.ok());
    EXPECT_THAT(kept.status().message(),
                HasSubstr(std::to_string(bytes.size() - 1) + " of " +
                          std::to_string(bytes.size()) + " bytes arrived"));
  }
  EXPECT_FALSE((*store)->Find({"j", 7, 2}).has_value());
  EXPECT_EQ((*store)->used_bytes(), bytes.size());
}

TEST(ReplicaStoreTest, RefusesDamagedShortLongAndMislabeledFiles) {
  testing::TempDir dir;
  auto store =
      ReplicaStore::Open(io::DefaultFileSystem(), dir.File("held"), 64 << 20);
  ASSERT_TRUE(store.ok());
  std::string bytes = ShardBytes(dir, 5, 2);
  // One flipped byte inside the chunk data.
  std::string damaged = bytes;
  damaged[200] ^= 0x10;
  absl::Status s = Send(store->get(), {"j", 5, 2}, damaged);
  EXPECT_TRUE(absl::IsDataLoss(s) || absl::IsInvalidArgument(s)) << s;
  // Short: the sender stopped early.
  auto rx = (*store)->Receive({"j", 5, 2}, bytes.size());
  ASSERT_TRUE(rx.ok());
  ASSERT_TRUE((*rx)->Append(absl::string_view(bytes).substr(0, 1000)).ok());
  EXPECT_THAT((*rx)->Finish().status().message(),
              HasSubstr("1000 of " + std::to_string(bytes.size())));
  rx->reset();
  // More than announced.
  rx = (*store)->Receive({"j", 5, 2}, 10);
  ASSERT_TRUE(rx.ok());
  EXPECT_THAT((*rx)->Append(bytes).message(), HasSubstr("more than"));
  rx->reset();
  // Another shard's file under this key.
  s = Send(store->get(), {"j", 6, 2}, bytes);
  EXPECT_THAT(s.message(), HasSubstr("is job j step 5 rank 2"));
  // Nothing counts, nothing is left behind, the budget is whole again.
  EXPECT_FALSE((*store)->Find({"j", 5, 2}).has_value());
  EXPECT_FALSE((*store)->Find({"j", 6, 2}).has_value());
  EXPECT_EQ((*store)->used_bytes(), 0u);
  auto left = io::DefaultFileSystem()->ListDir(dir.File("held/j"));
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty()) << left->front();
  EXPECT_FALSE((*store)->Receive({"../x", 1, 0}, 10).ok());
}

TEST(ReplicaStoreTest, HoldsItsBudgetCountingTransfersInProgress) {
  testing::TempDir dir;
  const std::string bytes = ShardBytes(dir, 1, 0);
  auto store = ReplicaStore::Open(io::DefaultFileSystem(), dir.File("held"),
                                  bytes.size() * 2 - 1);
  ASSERT_TRUE(store.ok());
  auto first = (*store)->Receive({"j", 1, 0}, bytes.size());
  ASSERT_TRUE(first.ok());
  auto second = (*store)->Receive({"j", 1, 1}, bytes.size());
  ASSERT_TRUE(absl::IsResourceExhausted(second.status()));
  EXPECT_THAT(second.status().message(), HasSubstr("job j step 1 rank 1"));
  first->reset();  // given up: its reservation comes back
  EXPECT_TRUE(Send(store->get(), {"j", 1, 0}, bytes).ok());
}

TEST(ReplicaStoreTest, ReopenKeepsCompleteFilesAndDropsPartialOnes) {
  testing::TempDir dir;
  const std::string bytes = ShardBytes(dir, 3, 1);
  {
    auto store =
        ReplicaStore::Open(io::DefaultFileSystem(), dir.File("held"), 64 << 20);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(Send(store->get(), {"j", 3, 1}, bytes).ok());
  }
  // What a daemon killed mid-transfer leaves.
  testing::WriteAll(
      dir.File("held/j/00000000000000000004-0000000001.ckpt.partial"),
      bytes.substr(0, 5000));
  auto store =
      ReplicaStore::Open(io::DefaultFileSystem(), dir.File("held"), 64 << 20);
  ASSERT_TRUE(store.ok());
  EXPECT_TRUE((*store)->Find({"j", 3, 1}).has_value());
  EXPECT_FALSE((*store)->Find({"j", 4, 1}).has_value());
  EXPECT_EQ((*store)->used_bytes(), bytes.size());
  auto left = io::DefaultFileSystem()->ListDir(dir.File("held/j"));
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->size(), 1u);
}

// An increment (a shard storing chunks in earlier ones of its rank) is kept
// only beside the very files it names; its base is not dropped before it,
// it reads through them, after a restart an increment whose base is gone is
// deleted, and another save of its base's step makes it self-contained.
TEST(ReplicaStoreTest, AnIncrementIsKeptOnlyWithItsBasesAndBeforeThem) {
  testing::TempDir dir;
  auto store =
      ReplicaStore::Open(io::DefaultFileSystem(), dir.File("held"), 64 << 20);
  ASSERT_TRUE(store.ok()) << store.status();
  // Steps 1 and 2 of rank 0, 2 over 1 (one of its chunks changed).
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<uint8_t> data = testing::RandomBytes(rng, 6 << 20);
  auto write = [&](uint64_t step,
                   std::shared_ptr<const snapshot::ShardBase> base) {
    const std::string path =
        dir.File(snapshot::ShardFileName(step, 0, ".shard"));
    snapshot::ShardWriterOptions options;
    options.base = std::move(base);
    snapshot::ShardWriter writer(io::DefaultFileSystem(), path,
                                 {"j", step, 0, 1}, options);
    EXPECT_TRUE(writer.AddBytes("state", data).ok());
    absl::StatusOr<proto::ShardManifest> m = writer.Commit();
    EXPECT_TRUE(m.ok()) << m.status();
    auto next = std::make_shared<snapshot::ShardBase>();
    next->manifest = *m;
    next->manifest_xxh3 = writer.manifest_xxh3();
    return std::make_pair(testing::ReadAll(path), next);
  };
  auto [full, base] = write(1, nullptr);
  data[5 << 20] ^= 1;
  auto [increment, unused] = write(2, base);
  ASSERT_LT(increment.size(), full.size() / 2);
  const std::vector<uint8_t> saved2 = data;

  // Without its base, or beside another file of step 1, it is refused.
  absl::Status refused = Send(store->get(), {"j", 2, 0}, increment);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("step 1"));
  data[0] ^= 1;
  auto [other, unused1] = write(1, nullptr);
  ASSERT_TRUE(Send(store->get(), {"j", 1, 0}, other).ok());
  refused = Send(store->get(), {"j", 2, 0}, increment);
  EXPECT_THAT(refused.message(), HasSubstr("holds another copy"));
  EXPECT_FALSE((*store)->Find({"j", 2, 0}).has_value());

  // Beside the very file it names: kept, and read through it.
  ASSERT_TRUE(Send(store->get(), {"j", 1, 0}, full).ok());
  ASSERT_TRUE(Send(store->get(), {"j", 2, 0}, increment).ok());
  auto e = (*store)->Find({"j", 2, 0});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->base_steps, std::vector<uint64_t>{1});
  auto reader = snapshot::ShardReader::Open(io::DefaultFileSystem(), e->path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<uint8_t> back(saved2.size());
  ASSERT_TRUE((*reader)->ReadItem("state", absl::MakeSpan(back)).ok());
  EXPECT_TRUE(back == saved2);
  // Its base stays while it does.
  EXPECT_TRUE(absl::IsFailedPrecondition((*store)->Drop({"j", 1, 0})));

  // A restart keeps both; with the base gone, the increment goes too.
  store->reset();
  store =
      ReplicaStore::Open(io::DefaultFileSystem(), dir.File("held"), 64 << 20);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Find({"j", 2, 0}).has_value());
  EXPECT_EQ((*store)->Find({"j", 1, 0})->manifest_xxh3, base->manifest_xxh3);
  const std::string base_path = (*store)->Find({"j", 1, 0})->path;
  store->reset();
  ASSERT_EQ(std::remove(base_path.c_str()), 0);
  store =
      ReplicaStore::Open(io::DefaultFileSystem(), dir.File("held"), 64 << 20);
  ASSERT_TRUE(store.ok());
  EXPECT_FALSE((*store)->Find({"j", 2, 0}).has_value());
  EXPECT_EQ((*store)->used_bytes(), 0u);

  // Another save of step 1 replacing the base: the increment is made
  // self-contained first, and still reads as saved.
  ASSERT_TRUE(Send(store->get(), {"j", 1, 0}, full).ok());
  ASSERT_TRUE(Send(store->get(), {"j", 2, 0}, increment).ok());
  absl::Status replaced = Send(store->get(), {"j", 1, 0}, other);
  ASSERT_TRUE(replaced.ok()) << replaced;
  e = (*store)->Find({"j", 2, 0});
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->base_steps.empty());
  EXPECT_GT(e->bytes, increment.size());
  EXPECT_EQ((*store)->used_bytes(), e->bytes + other.size());
  EXPECT_TRUE((*store)->Drop({"j", 1, 0}).ok());
  reader = snapshot::ShardReader::Open(io::DefaultFileSystem(), e->path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::fill(back.begin(), back.end(), 0);
  ASSERT_TRUE((*reader)->ReadItem("state", absl::MakeSpan(back)).ok());
  EXPECT_TRUE(back == saved2);
}

}  // namespace
}  // namespace ckpt::daemon
