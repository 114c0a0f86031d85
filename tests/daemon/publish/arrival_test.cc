// Arrival: a version's files read by peers while they arrive. A reader waits
// for the bytes it reads, fails when they were found bad (restart), when the
// arrival is given up, or when nothing arrives for its stall limit; a placed
// arrival serves every byte.
#include "daemon/publish/arrival.h"

#include <cstring>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

proto::VersionRecord Record(uint64_t bytes) {
  proto::VersionRecord r;
  r.set_topic("policy");
  r.set_version(3);
  r.set_world_size(1);
  proto::VersionFile* f = r.add_files();
  f->set_rank(0);
  f->set_file_bytes(bytes);
  return r;
}

class ArrivalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto arrival = Arrival::Create(io::DefaultFileSystem(), Record(kBytes),
                                   dir_.File("recv"));
    ASSERT_TRUE(arrival.ok()) << arrival.status();
    arrival_ = *std::move(arrival);
  }
  // Writes bytes [from, to) as a fetch would: value = offset % 251.
  void Deliver(uint64_t from, uint64_t to) {
    absl::Span<uint8_t> space = arrival_->Space(0, from);
    for (uint64_t i = from; i < to; ++i) space[i - from] = i % 251;
    arrival_->Arrived(0, to);
  }
  static constexpr uint64_t kBytes = 3 << 20;
  testing::TempDir dir_;
  std::shared_ptr<Arrival> arrival_;
};

TEST_F(ArrivalTest, AReaderGetsEachPieceAsItArrives) {
  auto reader = arrival_->ReaderFrom(0, 1000, absl::Seconds(30));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(*(*reader)->Size(), kBytes - 1000);
  std::thread fetch([&] {
    for (uint64_t at = 0; at < kBytes; at += 64 << 10) {
      Deliver(at, std::min(kBytes, at + (64 << 10)));
    }
  });
  std::vector<uint8_t> got(kBytes - 1000);
  ASSERT_TRUE((*reader)->Read(0, absl::MakeSpan(got)).ok());
  fetch.join();
  for (uint64_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], (i + 1000) % 251) << i;
  }
}

TEST_F(ArrivalTest, BytesFoundBadFailTheReadersThatReadThem) {
  Deliver(0, 1 << 20);
  auto reader = arrival_->ReaderFrom(0, 0, absl::Seconds(30));
  ASSERT_TRUE(reader.ok());
  std::vector<uint8_t> got(1 << 20);
  ASSERT_TRUE((*reader)->Read(0, absl::MakeSpan(got)).ok());
  arrival_->Restart(0);
  EXPECT_EQ(arrival_->ArrivedOf(0), 0u);
  Deliver(0, kBytes);
  absl::Status next = (*reader)->Read(1 << 20, absl::MakeSpan(got));
  EXPECT_TRUE(absl::IsDataLoss(next)) << next;
  EXPECT_THAT(next.message(), HasSubstr("fetched again"));
  // A reader opened after the restart reads the new bytes.
  auto fresh = arrival_->ReaderFrom(0, 0, absl::Seconds(30));
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE((*fresh)->Read(1 << 20, absl::MakeSpan(got)).ok());
}

TEST_F(ArrivalTest, AStalledOrAbandonedArrivalFailsItsReaders) {
  Deliver(0, 100);
  auto reader = arrival_->ReaderFrom(0, 0, absl::Milliseconds(50));
  ASSERT_TRUE(reader.ok());
  std::vector<uint8_t> got(200);
  absl::Status stalled = (*reader)->Read(0, absl::MakeSpan(got));
  EXPECT_TRUE(absl::IsUnavailable(stalled)) << stalled;
  EXPECT_THAT(stalled.message(), HasSubstr("nothing arrived"));
  auto waiting = arrival_->ReaderFrom(0, 0, absl::Seconds(30));
  ASSERT_TRUE(waiting.ok());
  std::thread give_up(
      [&] { arrival_->Finish(absl::CancelledError("ckptd stops")); });
  absl::Status abandoned = (*waiting)->Read(0, absl::MakeSpan(got));
  give_up.join();
  EXPECT_TRUE(absl::IsCancelled(abandoned)) << abandoned;
}

TEST_F(ArrivalTest, BadRequestsAreNamed) {
  auto no_rank = arrival_->ReaderFrom(1, 0, absl::Seconds(1));
  EXPECT_TRUE(absl::IsNotFound(no_rank.status()));
  auto past = arrival_->ReaderFrom(0, kBytes + 1, absl::Seconds(1));
  EXPECT_TRUE(absl::IsOutOfRange(past.status()));
  proto::VersionRecord short_record = Record(10);
  short_record.set_world_size(2);
  auto bad =
      Arrival::Create(io::DefaultFileSystem(), short_record, dir_.File("bad"));
  EXPECT_TRUE(absl::IsDataLoss(bad.status())) << bad.status();
}

}  // namespace
}  // namespace ckpt::daemon
