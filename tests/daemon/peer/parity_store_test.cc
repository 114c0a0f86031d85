// ParityStore: contributions XORed in pieces, concurrently and in any order,
// make the erasure code's parity; one cut short or damaged empties the block
// and fails those under way; a reopen keeps complete blocks and drops one a
// crash cut into; refusals name what is wrong.
#include "daemon/peer/parity_store.h"

#include <random>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/erasure_code.h"
#include "snapshot/xxh3.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;
using Bytes = std::vector<uint8_t>;

class ParityStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = testing::TestSeed();
    std::mt19937_64 rng(seed_);
    for (size_t len : {300000, 123457, 4096}) {
      Bytes b(len);
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      data_.push_back(std::move(b));
    }
    group_.set_group(2);
    for (int i = 0; i < 3; ++i) {
      proto::ShardHolder* h = group_.add_data();
      h->set_rank(i);
      h->set_node("node" + std::to_string(i));
      h->set_file_bytes(data_[i].size());
    }
    group_.add_parity_nodes("p0");
    group_.add_parity_nodes("p1");
    group_.set_stripe_bytes(300000);
    Reopen();
  }
  void Reopen(uint64_t budget = 1 << 30) {
    store_.reset();
    auto s =
        ParityStore::Open(io::DefaultFileSystem(), dir_.File("parity"), budget);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  proto::ParityBlockKey Key(uint32_t index) const {
    proto::ParityBlockKey k;
    k.set_job("job");
    k.set_step(7);
    k.set_group(2);
    k.set_index(index);
    return k;
  }
  // Data block i's contribution to parity block j.
  Bytes ContributionOf(int i, int j) const {
    Bytes out[2] = {Bytes(data_[i].size()), Bytes(data_[i].size())};
    uint8_t* ptrs[] = {out[0].data(), out[1].data()};
    code_.Contribute(i, data_[i], ptrs);
    return out[j];
  }
  Bytes Expected(int j) const {
    Bytes p[2] = {Bytes(300000), Bytes(300000)};
    uint8_t* ptrs[] = {p[0].data(), p[1].data()};
    std::vector<absl::Span<const uint8_t>> spans(data_.begin(), data_.end());
    code_.Encode(spans, ptrs);
    return p[j];
  }
  // Sends data block i's contribution to block j in pieces of `piece` bytes.
  absl::StatusOr<proto::ParityBlockRecord> Send(int i, int j,
                                                size_t piece = 65536) {
    const Bytes c = ContributionOf(i, j);
    auto contribution = store_->Contribute(Key(j), group_, i);
    if (!contribution.ok()) return contribution.status();
    for (size_t off = 0; off < c.size(); off += piece) {
      absl::Status s = (*contribution)
                           ->Append(absl::MakeConstSpan(c).subspan(
                               off, std::min(piece, c.size() - off)));
      if (!s.ok()) return s;
    }
    return (*contribution)->Finish(XXH3_64bits(c.data(), c.size()));
  }
  Bytes BlockBytes(int j) {
    auto complete = store_->OpenComplete(Key(j));
    EXPECT_TRUE(complete.ok()) << complete.status();
    if (!complete.ok()) return {};
    return Bytes(complete->map->data(),
                 complete->map->data() + complete->map->size());
  }

  uint64_t seed_ = 0;
  testing::TempDir dir_;
  snapshot::ErasureCode code_ = *snapshot::ErasureCode::Create(3, 2);
  std::vector<Bytes> data_;
  proto::ParityGroup group_;
  std::unique_ptr<ParityStore> store_;
};

TEST_F(ParityStoreTest, ConcurrentContributionsMakeTheParity) {
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(6);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 2; ++j) {
      threads.emplace_back([&, i, j] {
        results[i * 2 + j] = Send(i, j, 4096 + 1000 * i).status();
      });
    }
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  for (int j = 0; j < 2; ++j) {
    absl::StatusOr<proto::ParityBlockRecord> r = store_->Record(Key(j));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->complete());
    EXPECT_EQ(r->contributions_size(), 3);
    const Bytes block = BlockBytes(j);
    EXPECT_EQ(block, Expected(j)) << "parity block " << j;
    EXPECT_EQ(r->block_xxh3(), XXH3_64bits(block.data(), block.size()));
  }
  EXPECT_EQ(store_->used_bytes(), 600000u);
  // A reopen (a restarted daemon) keeps complete blocks.
  Reopen();
  EXPECT_EQ(BlockBytes(1), Expected(1));
  EXPECT_EQ(store_->used_bytes(), 600000u);
}

TEST_F(ParityStoreTest, AContributionCutShortEmptiesTheBlockAndFailsOthers) {
  ASSERT_TRUE(Send(2, 0).ok());
  const Bytes c0 = ContributionOf(0, 0);
  const Bytes c1 = ContributionOf(1, 0);
  auto other = store_->Contribute(Key(0), group_, 1);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->Append(absl::MakeConstSpan(c1).first(1000)).ok());
  {
    auto cut = store_->Contribute(Key(0), group_, 0);
    ASSERT_TRUE(cut.ok());
    ASSERT_TRUE((*cut)->Append(absl::MakeConstSpan(c0).first(5000)).ok());
  }  // the sender went away
  absl::StatusOr<proto::ParityBlockRecord> r = store_->Record(Key(0));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->contributions_size(), 0) << "data block 2's went with it";
  EXPECT_EQ(r->applying_size(), 0);
  EXPECT_EQ((*other)->Append(absl::MakeConstSpan(c1).subspan(1000)).code(),
            absl::StatusCode::kAborted);
  other->reset();
  // Everything sent again: the block is right.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Send(i, 0).ok()) << i;
  EXPECT_EQ(BlockBytes(0), Expected(0));
}

TEST_F(ParityStoreTest, ADamagedContributionIsRefusedAndEmptiesTheBlock) {
  ASSERT_TRUE(Send(0, 1).ok());
  Bytes c = ContributionOf(1, 1);
  const uint64_t sent_hash = XXH3_64bits(c.data(), c.size());
  c[777] ^= 1;  // damaged on the way
  auto contribution = store_->Contribute(Key(1), group_, 1);
  ASSERT_TRUE(contribution.ok());
  ASSERT_TRUE((*contribution)->Append(c).ok());
  absl::StatusOr<proto::ParityBlockRecord> r =
      (*contribution)->Finish(sent_hash);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(),
              HasSubstr("parity block 1 of group 2 of job job step 7: data "
                        "block 1's contribution arrived damaged"));
  EXPECT_EQ(store_->Record(Key(1))->contributions_size(), 0);
  EXPECT_THAT(store_->OpenComplete(Key(1)).status().message(),
              HasSubstr("is not complete (0 of 3 data blocks contributed)"));
}

TEST_F(ParityStoreTest, ABlockACrashCutIntoIsDroppedOnReopen) {
  ASSERT_TRUE(Send(0, 0).ok());
  ASSERT_TRUE(Send(0, 1).ok());
  ASSERT_TRUE(Send(1, 1).ok());
  const Bytes c = ContributionOf(1, 0);
  auto contribution = store_->Contribute(Key(0), group_, 1);
  ASSERT_TRUE(contribution.ok());
  ASSERT_TRUE((*contribution)->Append(absl::MakeConstSpan(c).first(100)).ok());
  // The daemon dies here: nothing runs the contribution's destructor.
  (void)contribution->release();
  store_.release();  // as if the process were gone (leaks, on purpose)
  Reopen();
  EXPECT_EQ(store_->Record(Key(0)).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<proto::ParityBlockRecord> kept = store_->Record(Key(1));
  ASSERT_TRUE(kept.ok()) << "an untouched block stays";
  EXPECT_EQ(kept->contributions_size(), 2);
  EXPECT_EQ(store_->used_bytes(), 300000u);
  ASSERT_TRUE(Send(2, 1).ok());
  EXPECT_EQ(BlockBytes(1), Expected(1));
}

TEST_F(ParityStoreTest, RefusalsNameWhatIsWrong) {
  ASSERT_TRUE(Send(0, 0).ok());
  EXPECT_THAT(store_->Contribute(Key(0), group_, 0).status().message(),
              HasSubstr("has data block 0's contribution"));
  EXPECT_EQ(store_->Contribute(Key(0), group_, 0).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(store_->Contribute(Key(0), group_, 3).status().message(),
              HasSubstr("data block 3 is not one of its group's 3"));
  proto::ParityGroup other = group_;
  other.set_stripe_bytes(400000);
  EXPECT_EQ(store_->Contribute(Key(0), other, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Too long a contribution.
  auto c = store_->Contribute(Key(0), group_, 2);
  ASSERT_TRUE(c.ok());
  Bytes big(5000);
  EXPECT_THAT((*c)->Append(big).message(),
              HasSubstr("data block 2 sent more than its 4096 bytes"));
  c->reset();
  // The budget.
  Reopen(400000);
  EXPECT_THAT(store_->Contribute(Key(1), group_, 0).status().message(),
              HasSubstr("300000 bytes do not fit (300000 of 400000 bytes"));
  // A dropped block fails the contribution still under way into it.
  auto late = store_->Contribute(Key(0), group_, 1);
  ASSERT_TRUE(late.ok());
  ASSERT_TRUE(store_->Drop(Key(0)).ok());
  EXPECT_EQ(store_->used_bytes(), 0u);
  Bytes piece(10);
  EXPECT_EQ((*late)->Append(piece).code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace ckpt::daemon
