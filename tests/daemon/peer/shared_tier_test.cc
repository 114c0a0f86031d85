// SharedTier on its own: a copy is reported only once it is durable on the
// shared file system (it survives a power loss there), a failed write is
// tried again and leaves no copy under the final name meanwhile, and
// retention keeps the newest committed steps and those not committed yet.
#include "daemon/peer/shared_tier.h"

#include <cerrno>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection_fs.h"
#include "io/file_system.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

using ::testing::HasSubstr;

class SharedTierTest : public ::testing::Test {
 protected:
  // A persisted shard of job "j" on this node's disk, as the catalog has it.
  proto::ShardRecord Persisted(uint64_t step, uint32_t rank) {
    const std::string path =
        dir_.File("local-" + std::to_string(step) + "-" + std::to_string(rank));
    snapshot::ShardWriter writer(io::DefaultFileSystem(), path,
                                 {"j", step, rank, 2}, {});
    data_.assign(200000, 0);
    for (size_t i = 0; i < data_.size(); ++i)
      data_[i] = static_cast<uint8_t>(i * 13 + step);
    EXPECT_TRUE(writer.AddBytes("state", data_).ok());
    EXPECT_TRUE(writer.Commit().ok());
    proto::ShardRecord r;
    r.set_job("j");
    r.set_step(step);
    r.set_rank(rank);
    r.set_world_size(2);
    r.set_state(proto::SHARD_PERSISTED);
    r.set_shard_path(path);
    return r;
  }
  std::unique_ptr<SharedTier> Start(SharedTierOptions options) {
    options.dir = dir_.File("shared");
    auto tier = SharedTier::Start(&fs_, options, &metrics_,
                                  [this](const proto::ShardRecord& shard) {
                                    absl::MutexLock lock(&mu_);
                                    copied_.push_back(shard.step());
                                  });
    EXPECT_TRUE(tier.ok()) << tier.status();
    return tier.ok() ? *std::move(tier) : nullptr;
  }
  // Waits (up to a minute) until `n` copies were reported.
  std::vector<uint64_t> AwaitCopied(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return copied_.size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Minutes(1));
    return copied_;
  }

  testing::TempDir dir_;
  io::FaultInjectionFs fs_{io::DefaultFileSystem()};
  Metrics metrics_;
  std::vector<uint8_t> data_;
  absl::Mutex mu_;
  std::vector<uint64_t> copied_ ABSL_GUARDED_BY(mu_);
};

TEST_F(SharedTierTest, ACopyIsReportedOnlyOnceItIsDurable) {
  std::unique_ptr<SharedTier> tier = Start({.every = 2});
  ASSERT_NE(tier, nullptr);
  EXPECT_TRUE(tier->Wants(4));
  EXPECT_FALSE(tier->Wants(5));
  tier->Enqueue(Persisted(4, 1));
  ASSERT_EQ(AwaitCopied(1), std::vector<uint64_t>{4});
  // The power fails on the shared file system right after the report: the
  // copy is there, whole.
  tier.reset();
  ASSERT_TRUE(fs_.SimulatePowerLoss().ok());
  tier = Start({.every = 2});
  ASSERT_TRUE(tier->Has("j", 4, 1));
  absl::StatusOr<proto::ShardRecord> found = tier->Find("j", 4, 1);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->state(), proto::SHARD_PERSISTED);
  EXPECT_THAT(found->shard_path(), HasSubstr(dir_.File("shared/j/")));
  auto reader =
      snapshot::ShardReader::Open(io::DefaultFileSystem(), found->shard_path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<uint8_t> back(data_.size());
  ASSERT_TRUE((*reader)->ReadItem("state", absl::MakeSpan(back)).ok());
  EXPECT_EQ(back, data_);
  EXPECT_FALSE(tier->Has("j", 6, 1));
  EXPECT_EQ(tier->Find("j", 6, 1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SharedTierTest, AFailedWriteIsTriedAgainAndNothingHalfWrittenShows) {
  std::unique_ptr<SharedTier> tier = Start({});
  ASSERT_NE(tier, nullptr);
  fs_.FailWriteAt(1, EIO);
  tier->Enqueue(Persisted(3, 0));
  // Until the second attempt (a second later) there is no copy of the step.
  EXPECT_FALSE(tier->Has("j", 3, 0));
  ASSERT_EQ(AwaitCopied(1), std::vector<uint64_t>{3});
  EXPECT_TRUE(tier->Has("j", 3, 0));
  EXPECT_THAT(metrics_.Render(),
              HasSubstr("ckpt_shared_failures_total{job=\"j\"} 1"));
}

TEST_F(SharedTierTest, RetentionKeepsTheNewestCommittedStepsAndNewerOnes) {
  std::unique_ptr<SharedTier> tier = Start({.keep = 2});
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(fs_.CreateDirs(dir_.File("shared/j")).ok());
  auto name = [](uint64_t step) {
    char n[64];
    std::snprintf(n, sizeof(n), "%020llu-%010u.ckpt",
                  static_cast<unsigned long long>(step), 0u);
    return std::string(n);
  };
  for (uint64_t step = 1; step <= 5; ++step)
    testing::WriteAll(dir_.File("shared/j/" + name(step)), "x");
  // A copy of step 1 another node is still writing.
  testing::WriteAll(dir_.File("shared/j/" + name(1) + ".partial"), "x");
  std::vector<proto::CommitRecord> commits;
  for (uint64_t step : {1, 2, 3}) {
    proto::CommitRecord& c = commits.emplace_back();
    c.set_job("j");
    c.set_step(step);
    c.set_tier(proto::TIER_SHARED);
  }
  commits.emplace_back().set_step(1);  // another tier's: no say here
  tier->CollectGarbage("j", commits);
  for (uint64_t step = 1; step <= 5; ++step) {
    EXPECT_EQ(tier->Has("j", step, 0), step >= 2) << "step " << step;
  }
  EXPECT_TRUE(*io::DefaultFileSystem()->Exists(
      dir_.File("shared/j/" + name(1) + ".partial")));
}

}  // namespace
}  // namespace ckpt::daemon
