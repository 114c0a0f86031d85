// VersionStore and the Publisher's arrivals: the versions a node holds stay
// within their budget. A topic keeps its newest versions and any a reader
// holds open; room is made by dropping the oldest versions no reader holds;
// what does not fit is refused naming what holds the memory; a record from
// another node whose sizes do not fit or do not add up makes no file.
#include "daemon/publish/version_store.h"

#include "daemon/catalog/kv_store.h"
#include "daemon/coord/embedded_coordinator.h"
#include "daemon/publish/publisher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kVersionBytes = 30 << 10;  // one rank's file

class VersionStoreTest : public ::testing::Test {
 protected:
  void Open(int keep, uint64_t budget) {
    auto store = VersionStore::Open(io::DefaultFileSystem(),
                                    {dir_.File("versions"), keep, budget});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  // Version `v` of "policy", one rank's file of kVersionBytes, placed.
  void Place(uint64_t v) {
    auto dir = store_->NewDir("policy", absl::StrCat(".making-", v));
    ASSERT_TRUE(dir.ok()) << dir.status();
    ASSERT_TRUE(io::WriteStringToFile(
                    io::DefaultFileSystem(),
                    io::JoinPath(*dir, VersionStore::RankFileName(0)),
                    std::string(kVersionBytes, static_cast<char>('a' + v)))
                    .ok());
    proto::VersionRecord record;
    record.set_topic("policy");
    record.set_version(v);
    record.set_created_unix_micros(static_cast<int64_t>(v));
    ASSERT_TRUE(store_->Place(*dir, record).ok());
  }
  // A reader holding version `v` open, as client::Subscriber's does.
  std::unique_ptr<io::ReadableFile> Hold(uint64_t v) {
    auto file = io::DefaultFileSystem()->NewReadableFile(
        io::JoinPath(store_->VersionDir("policy", v),
                     VersionStore::RankFileName(0)),
        io::FileOptions());
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? *std::move(file) : nullptr;
  }
  std::vector<uint64_t> Held() {
    std::set<uint64_t> held = store_->Held("policy");
    return {held.begin(), held.end()};
  }

  testing::TempDir dir_;
  std::unique_ptr<VersionStore> store_;
};

TEST_F(VersionStoreTest, KeepsTheNewestVersionsAndAnyAReaderHolds) {
  Open(/*keep=*/2, 1 << 30);
  Place(1);
  auto reader = Hold(1);
  for (uint64_t v = 2; v <= 4; ++v) Place(v);
  EXPECT_THAT(Held(), ElementsAre(1, 3, 4));
  auto record = store_->Record("policy", 1);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->version(), 1u);
  EXPECT_EQ(store_->UsedBytes(),
            3 * kVersionBytes + 3 * record->ByteSizeLong());
  reader.reset();  // let go: the next placing drops it
  Place(5);
  EXPECT_THAT(Held(), ElementsAre(4, 5));
}

TEST_F(VersionStoreTest, RoomIsMadeFromUnheldVersionsOrRefusedNamingHolders) {
  Open(/*keep=*/10, 4 * kVersionBytes);
  for (uint64_t v = 1; v <= 3; ++v) Place(v);
  // Room for one more: the oldest version goes.
  auto room = store_->MakeRoom(kVersionBytes, "version 4 of topic policy");
  ASSERT_TRUE(room.ok()) << room.status();
  EXPECT_THAT(Held(), ElementsAre(2, 3));
  // Readers hold the rest: nothing can go.
  auto held2 = Hold(2), held3 = Hold(3);
  absl::Status s =
      store_->MakeRoom(kVersionBytes + 1000, "version 5 of topic policy")
          .status();
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("version 5 of topic policy needs"));
  EXPECT_THAT(s.message(), HasSubstr("--publish-budget"));
  // Each version named with its bytes (its file and record).
  EXPECT_THAT(std::string(s.message()),
              ::testing::ContainsRegex(
                  "topic policy version 2 \\(307[0-9][0-9] bytes, held by a "
                  "reader\\), topic policy version 3 \\(307[0-9][0-9] bytes, "
                  "held by a reader, its newest\\)"));
  EXPECT_THAT(s.message(), HasSubstr("being made or arriving"));
  // A room that grows past what is left is refused the same way.
  s = (*room)->GrowTo(3 * kVersionBytes);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ((*room)->bytes(), kVersionBytes);
  // Letting go of a reader, and of the room, makes room again.
  held2.reset();
  room->reset();
  auto again = store_->MakeRoom(2 * kVersionBytes, "version 5 of topic policy");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(Held(), ElementsAre(3));
  // More than the whole budget is refused at once, whatever is held.
  s = store_->MakeRoom(5 * kVersionBytes, "version 6 of topic policy").status();
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("more than the whole budget"));
}

TEST_F(VersionStoreTest, WhatACrashLeftInTheMakingGoesAtOpen) {
  Open(2, 1 << 30);
  Place(1);
  auto making = store_->NewDir("policy", ".receiving-2");
  ASSERT_TRUE(making.ok()) << making.status();
  ASSERT_TRUE(io::WriteStringToFile(io::DefaultFileSystem(),
                                    io::JoinPath(*making, "rank-0.shard"), "x")
                  .ok());
  Open(2, 1 << 30);
  EXPECT_FALSE(io::DefaultFileSystem()->Exists(*making).value_or(true));
  EXPECT_THAT(Held(), ElementsAre(1));
  EXPECT_TRUE(
      absl::IsInternal(store_->NewDir("policy", "not-hidden").status()));
}

// A record from another node says how large the version's files are: its
// sizes are checked and made room for before any file is made.
TEST(PublisherArrivalTest, ARecordThatDoesNotFitOrAddUpMakesNoFile) {
  testing::TempDir dir;
  auto kv = KvStore::Open(dir.File("db"));
  ASSERT_TRUE(kv.ok()) << kv.status();
  EmbeddedCoordinator coordinator(kv->get());
  Metrics metrics;
  PublishOptions options;
  options.node_id = "node-a";
  options.dir = dir.File("versions");
  options.budget_bytes = 1 << 20;
  auto publisher =
      Publisher::Open(io::DefaultFileSystem(), options, &coordinator, &metrics,
                      [](const std::string&, uint64_t, uint32_t) {
                        return absl::optional<std::string>();
                      });
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  proto::VersionRecord record;
  record.set_topic("policy");
  record.set_version(7);
  record.set_world_size(2);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    proto::VersionFile* file = record.add_files();
    file->set_rank(rank);
    file->set_file_bytes(~uint64_t{0} / 2 + 1);  // the two overflow 64 bits
  }
  record.set_bytes(0);
  absl::Status s = (*publisher)->BeginArrival(record).status();
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("version 7 of topic policy: its files"));
  record.mutable_files(0)->set_file_bytes(300 << 10);
  record.mutable_files(1)->set_file_bytes(300 << 10);
  record.set_bytes(1 << 20);
  s = (*publisher)->BeginArrival(record).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("its record says 1048576 bytes"));
  record.mutable_files(1)->set_file_bytes(800 << 10);
  record.set_bytes(1100 << 10);
  s = (*publisher)->BeginArrival(record).status();
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  // Nothing was made; a record that fits arrives.
  EXPECT_FALSE(io::DefaultFileSystem()
                   ->Exists(dir.File("versions/policy/.receiving-7"))
                   .value_or(true));
  record.mutable_files(1)->set_file_bytes(300 << 10);
  record.set_bytes(600 << 10);
  auto arrival = (*publisher)->BeginArrival(record);
  ASSERT_TRUE(arrival.ok()) << arrival.status();
  // A second version does not fit beside it while it arrives.
  record.set_version(8);
  s = (*publisher)->BeginArrival(record).status();
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  (*publisher)->AbandonArrival(**arrival, absl::CancelledError("test"));
  EXPECT_TRUE((*publisher)->BeginArrival(record).ok());
}

}  // namespace
}  // namespace ckpt::daemon
