// Publication (issue #37) through a real ckptd: committed steps published
// as versions of a topic, read back whole by a Subscriber, cast to bfloat16
// like torch; versions kept while a reader holds them; bad input refused
// with errors that name it.
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/subscriber.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapshot/cast.h"
#include "tests/client/connected_rank.h"
#include "tests/client/daemon_process.h"

namespace ckpt::client {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kPerRank = 3000;
constexpr uint32_t kWorld = 2;

// Two ranks of a job, each holding its half of "model/w" and its own "rng".
class PublishTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.Start()) << daemon_.log();
    for (uint32_t r = 0; r < kWorld; ++r) {
      w_[r].resize(kPerRank);
      ranks_[r] = ConnectRank(
          {"job", r, kWorld, daemon_.socket()},
          {w_[r].data(), kPerRank * kWorld, kPerRank * r, kPerRank, &rng_[r]});
      ASSERT_NE(ranks_[r], nullptr);
    }
  }
  // The state of `step` (its values depend on it).
  void Fill(uint64_t step) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      for (int64_t i = 0; i < kPerRank; ++i) {
        w_[r][i] = static_cast<float>(step) + 0.001f * (i + r * kPerRank) +
                   1e-7f * static_cast<float>(i % 7);
      }
      rng_[r] = absl::StrCat("rng-", step, "-", r);
    }
  }
  // Saves `step`, committed on disk.
  void Save(uint64_t step) {
    Fill(step);
    std::vector<std::shared_ptr<SaveHandle>> saves;
    for (uint32_t r = 0; r < kWorld; ++r) {
      auto save = ranks_[r]->SaveAsync(step);
      ASSERT_TRUE(save.ok()) << save.status();
      saves.push_back(*std::move(save));
    }
    for (auto& save : saves) {
      ASSERT_TRUE(save->WaitCommitted(proto::TIER_LOCAL_DISK).ok())
          << daemon_.log();
    }
  }
  absl::StatusOr<proto::VersionRecord> PublishStep(
      uint64_t step, std::vector<std::string> items = {"model/*"},
      std::string cast = "bf16", std::string topic = "policy") {
    proto::PublishRequest request;
    request.set_job("job");
    request.set_step(step);
    request.set_topic(topic);
    for (const std::string& glob : items) request.add_items(glob);
    request.set_cast(cast);
    return Publish(daemon_.socket(), request);
  }
  // What a reader must find: the global vector, each float as torch's
  // .to(torch.bfloat16) makes it.
  std::vector<uint16_t> ExpectedBf16() const {
    std::vector<uint16_t> out;
    for (uint32_t r = 0; r < kWorld; ++r) {
      for (float f : w_[r]) {
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        out.push_back(snapshot::Bfloat16Of(bits));
      }
    }
    return out;
  }
  static std::vector<uint16_t> ReadBf16(PublishedVersion& v) {
    std::vector<uint16_t> out(kPerRank * kWorld);
    absl::Status read = v.Read(
        "model/w", {reinterpret_cast<uint8_t*>(out.data()), out.size() * 2});
    EXPECT_TRUE(read.ok()) << read;
    return out;
  }

  testing::DaemonProcess daemon_;
  std::vector<float> w_[kWorld];
  std::string rng_[kWorld];
  std::unique_ptr<Checkpointer> ranks_[kWorld];
};

TEST_F(PublishTest, AStepIsReadBackWholeCastLikeTorch) {
  Save(1);
  auto published = PublishStep(1);
  ASSERT_TRUE(published.ok()) << published.status() << daemon_.log();
  EXPECT_EQ(published->version(), 1u);
  EXPECT_EQ(published->world_size(), kWorld);
  EXPECT_EQ(published->cast(), "bf16");
  auto subscriber = Subscriber::Connect(daemon_.socket(), "policy");
  ASSERT_TRUE(subscriber.ok()) << subscriber.status();
  auto seen = (*subscriber)->WaitForVersion(0, absl::Seconds(10));
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->version(), 1u);
  auto version = (*subscriber)->Open();
  ASSERT_TRUE(version.ok()) << version.status();
  // Only what the glob chose: the weights, not the RNG state.
  ASSERT_EQ((*version)->items().size(), 1u);
  auto item = (*version)->Find("model/w");
  ASSERT_TRUE(item.ok()) << item.status();
  EXPECT_EQ(item->dtype, proto::DTYPE_BFLOAT16);
  EXPECT_EQ(item->shape, std::vector<int64_t>{kPerRank * kWorld});
  EXPECT_EQ(item->bytes, static_cast<uint64_t>(kPerRank * kWorld * 2));
  EXPECT_EQ(ReadBf16(**version), ExpectedBf16());
  EXPECT_TRUE(absl::IsNotFound((*version)->Find("rng").status()));
  // Published as saved, every item: floats bit-exact, the bytes of rank 0.
  auto plain = PublishStep(1, {}, "", "plain");
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto reader = Subscriber::Connect(daemon_.socket(), "plain");
  ASSERT_TRUE(reader.ok());
  auto whole = (*reader)->Open(plain->version());
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<float> w(kPerRank * kWorld);
  ASSERT_TRUE((*whole)
                  ->Read("model/w",
                         {reinterpret_cast<uint8_t*>(w.data()), w.size() * 4})
                  .ok());
  EXPECT_TRUE(std::equal(w_[0].begin(), w_[0].end(), w.begin()));
  EXPECT_TRUE(std::equal(w_[1].begin(), w_[1].end(), w.begin() + kPerRank));
  auto rng = (*whole)->Find("rng");
  ASSERT_TRUE(rng.ok()) << rng.status();
  std::string rng_bytes(rng->bytes, '\0');
  ASSERT_TRUE((*whole)
                  ->Read("rng", {reinterpret_cast<uint8_t*>(rng_bytes.data()),
                                 rng_bytes.size()})
                  .ok());
  EXPECT_EQ(rng_bytes, rng_[0]);
}

// Versions increase; the node keeps the newest two (ckptd's default) and any
// version a reader holds: it keeps reading it, bit for bit, and others may
// open it too, until it lets go.
TEST_F(PublishTest, AReaderKeepsItsVersionWhileNewerOnesArrive) {
  Save(1);
  ASSERT_TRUE(PublishStep(1).ok());
  const std::vector<uint16_t> first = ExpectedBf16();
  auto subscriber = Subscriber::Connect(daemon_.socket(), "policy");
  ASSERT_TRUE(subscriber.ok());
  auto held = (*subscriber)->Open(1);
  ASSERT_TRUE(held.ok()) << held.status();
  // A waiter sees the next version as soon as it is made.
  absl::StatusOr<proto::VersionRecord> waited;
  std::thread waiter(
      [&] { waited = (*subscriber)->WaitForVersion(1, absl::Seconds(60)); });
  Save(2);
  auto second = PublishStep(2);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->version(), 2u);
  // From a save handle: published once the step is committed on disk.
  Fill(3);
  auto save = ranks_[0]->SaveAsync(3);
  auto other = ranks_[1]->SaveAsync(3);
  ASSERT_TRUE(save.ok() && other.ok());
  auto third = (*save)->Publish("policy", {"model/*"}, "bf16");
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->version(), 3u);
  EXPECT_EQ(third->step(), 3u);
  waiter.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_GE(waited->version(), 2u);
  EXPECT_EQ(ReadBf16(**held), first);
  auto again = (*subscriber)->Open(1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ReadBf16(**again), first);
  auto topics = ListTopics(daemon_.socket());
  ASSERT_TRUE(topics.ok()) << topics.status();
  EXPECT_EQ(std::vector<uint64_t>(topics->topics(0).held().begin(),
                                  topics->topics(0).held().end()),
            (std::vector<uint64_t>{1, 2, 3}));
  // Let go: the next version made drops it.
  held->reset();
  again->reset();
  auto fourth = PublishStep(3);
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_EQ(fourth->version(), 4u);
  absl::Status gone = (*subscriber)->Open(1).status();
  EXPECT_TRUE(absl::IsNotFound(gone)) << gone;
  EXPECT_THAT(gone.message(), HasSubstr("not on this node"));
  auto newest = (*subscriber)->Open();
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ((*newest)->version(), 4u);
  EXPECT_EQ(ReadBf16(**newest), ExpectedBf16());
  topics = ListTopics(daemon_.socket());
  ASSERT_TRUE(topics.ok()) << topics.status();
  ASSERT_EQ(topics->topics_size(), 1);
  EXPECT_EQ(topics->topics(0).newest(), 4u);
  EXPECT_EQ(std::vector<uint64_t>(topics->topics(0).held().begin(),
                                  topics->topics(0).held().end()),
            (std::vector<uint64_t>{3, 4}));
}

TEST_F(PublishTest, BadInputIsRefusedNamingWhatIsWrong) {
  Save(1);
  absl::Status s = PublishStep(1, {"model/*"}, "fp8").status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("cast to \"fp8\" is not supported"));
  s = PublishStep(1, {"optim/*"}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("no item matches --items optim/*"));
  s = PublishStep(7).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("not committed on disk"));
  s = PublishStep(1, {}, "", "a/b").status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("topic \"a/b\""));
  auto unknown = Subscriber::Connect(daemon_.socket(), "nobody");
  ASSERT_TRUE(unknown.ok());
  s = (*unknown)->Open().status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("topic nobody has no version"));
  s = (*unknown)->WaitForVersion(0, absl::Milliseconds(300)).status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("has no version above 0"));
  // Nothing was made of the refused publishes.
  auto topics = ListTopics(daemon_.socket());
  ASSERT_TRUE(topics.ok()) << topics.status();
  EXPECT_EQ(topics->topics_size(), 0);
}

// The versions a node holds stay within --publish-budget: readers holding
// versions open fill it until a publish is refused, naming what holds the
// memory; once they let go, publishing goes on and the old versions go.
TEST_F(PublishTest, VersionsStayWithinTheBudget) {
  daemon_.Kill();
  daemon_.set_extra_args({"--publish-budget", "600K"});
  ASSERT_TRUE(daemon_.Start()) << daemon_.log();
  for (uint32_t r = 0; r < kWorld; ++r) {
    ranks_[r] = ConnectRank(
        {"job", r, kWorld, daemon_.socket()},
        {w_[r].data(), kPerRank * kWorld, kPerRank * r, kPerRank, &rng_[r]});
    ASSERT_NE(ranks_[r], nullptr);
  }
  Save(1);
  auto subscriber = Subscriber::Connect(daemon_.socket(), "policy");
  ASSERT_TRUE(subscriber.ok());
  std::vector<std::unique_ptr<PublishedVersion>> held;
  absl::Status refused;
  for (int i = 0; i < 64 && refused.ok(); ++i) {
    auto published = PublishStep(1);
    refused = published.status();
    if (!published.ok()) break;
    auto version = (*subscriber)->Open(published->version());
    ASSERT_TRUE(version.ok()) << version.status();
    held.push_back(*std::move(version));
  }
  ASSERT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--publish-budget"));
  EXPECT_THAT(refused.message(), HasSubstr("held by a reader)"));
  ASSERT_GE(held.size(), 2u);
  // Every version held still reads back whole.
  for (auto& version : held) EXPECT_EQ(ReadBf16(*version), ExpectedBf16());
  const uint64_t last = held.back()->version();
  held.clear();
  auto next = PublishStep(1);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version(), last + 1);
  auto topics = ListTopics(daemon_.socket());
  ASSERT_TRUE(topics.ok()) << topics.status();
  EXPECT_EQ(std::vector<uint64_t>(topics->topics(0).held().begin(),
                                  topics->topics(0).held().end()),
            (std::vector<uint64_t>{last, last + 1}));
}

}  // namespace
}  // namespace ckpt::client
