// SharedTier on its own: a copy is reported only once it is durable on the
// shared file system (it survives a power loss there), a failed write is
// tried again and leaves no copy under the final name meanwhile, and
// retention keeps the newest committed steps and those not committed yet.
#include "daemon/peer/shared_tier.h"

#include <cerrno>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/fault_injection_fs.h"
#include "io/file_system.h"
#include "snapshot/format.h"
#include "snapshot/names.h"
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
  // A persisted shard of rank 0 of job "j" in `dir`, of `data` in 64 KiB
  // chunks, an increment over `*base` if `over_base`; `*base` becomes it.
  proto::ShardRecord PersistInChain(
      const std::string& dir, uint64_t step, const std::vector<uint8_t>& data,
      bool over_base, std::shared_ptr<snapshot::ShardBase>* base) {
    EXPECT_TRUE(io::DefaultFileSystem()->CreateDirs(dir).ok());
    const std::string path =
        io::JoinPath(dir, snapshot::ShardFileName(step, 0, ".shard"));
    snapshot::ShardWriterOptions options;
    options.chunk_size = 64 << 10;
    if (over_base) options.base = *base;
    snapshot::ShardWriter writer(io::DefaultFileSystem(), path,
                                 {"j", step, 0, 2}, options);
    EXPECT_TRUE(writer.AddBytes("state", data).ok());
    absl::StatusOr<proto::ShardManifest> m = writer.Commit();
    EXPECT_TRUE(m.ok()) << m.status();
    *base = std::make_shared<snapshot::ShardBase>();
    (*base)->manifest = *m;
    (*base)->manifest_xxh3 = writer.manifest_xxh3();
    proto::ShardRecord r;
    r.set_job("j");
    r.set_step(step);
    r.set_rank(0);
    r.set_world_size(2);
    r.set_state(proto::SHARD_PERSISTED);
    r.set_shard_path(path);
    return r;
  }
  // Whether the tier's copy of rank 0 of `step` holds `want`.
  static bool ReadsBack(SharedTier& tier, uint64_t step,
                        const std::vector<uint8_t>& want) {
    absl::StatusOr<proto::ShardRecord> r = tier.Find("j", step, 0);
    if (!r.ok()) return false;
    auto reader =
        snapshot::ShardReader::Open(io::DefaultFileSystem(), r->shard_path());
    if (!reader.ok()) return false;
    std::vector<uint8_t> out(want.size());
    return (*reader)->ReadItem("state", absl::MakeSpan(out)).ok() &&
           out == want;
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
  // The kept steps' commit markers were written (step 1's was not, and a
  // stale one goes with its step); they hold the commit record.
  EXPECT_FALSE(*io::DefaultFileSystem()->Exists(
      dir_.File("shared/j/00000000000000000001.commit")));
  for (uint64_t step : {2, 3}) {
    proto::CommitRecord marker;
    ASSERT_TRUE(marker.ParseFromString(testing::ReadAll(
        dir_.File("shared/j/" + snapshot::CommitMarkerName(step)))))
        << step;
    EXPECT_EQ(marker.step(), step);
  }
  testing::WriteAll(dir_.File("shared/j/" + snapshot::CommitMarkerName(2)), "");
  commits.emplace_back(commits[2]).set_step(4);
  tier->CollectGarbage("j", commits);
  EXPECT_FALSE(*io::DefaultFileSystem()->Exists(
      dir_.File("shared/j/" + snapshot::CommitMarkerName(2))));
  EXPECT_TRUE(*io::DefaultFileSystem()->Exists(
      dir_.File("shared/j/" + snapshot::CommitMarkerName(4))));
}

// Increments: a copy of an increment whose base is on the tier is the
// shard's own file, pinning its base; it reads through it, and retention
// keeps the base while the increment is kept, then drops both and the pin.
// Without its base on the tier, the copy stands alone.
TEST_F(SharedTierTest, AnIncrementIsCopiedOverItsBaseWhichItPins) {
  std::unique_ptr<SharedTier> tier = Start({.keep = 1});
  ASSERT_NE(tier, nullptr);
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<uint8_t> data = testing::RandomBytes(rng, 256 << 10);
  std::vector<std::vector<uint8_t>> saved(4);
  std::shared_ptr<snapshot::ShardBase> base;
  auto persist = [&](uint64_t step, bool over_base) {
    saved[step] = data;
    return PersistInChain(dir_.path(), step, data, over_base, &base);
  };
  auto size_of = [&](uint64_t step) {
    absl::StatusOr<proto::ShardRecord> r = tier->Find("j", step, 0);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *io::DefaultFileSystem()->FileSize(r->shard_path()) : 0;
  };
  auto reads_back = [&](uint64_t step) {
    return ReadsBack(*tier, step, saved[step]);
  };
  tier->Enqueue(persist(1, false));
  ASSERT_EQ(AwaitCopied(1).size(), 1u);
  data[1000] ^= 1;  // one chunk of four changes
  tier->Enqueue(persist(2, true));
  ASSERT_EQ(AwaitCopied(2).size(), 2u);
  EXPECT_LT(size_of(2), size_of(1) / 2) << "only the changed chunk";
  const std::string pin =
      dir_.File("shared/j/" + snapshot::ShardFileName(1, 0, ".ckpt") +
                ".base-of-00000000000000000002");
  EXPECT_TRUE(*io::DefaultFileSystem()->Exists(pin));
  EXPECT_TRUE(reads_back(2));
  auto commits = [](std::vector<uint64_t> steps) {
    std::vector<proto::CommitRecord> out;
    for (uint64_t step : steps) {
      proto::CommitRecord& c = out.emplace_back();
      c.set_job("j");
      c.set_step(step);
      c.set_tier(proto::TIER_SHARED);
    }
    return out;
  };
  // Keeping one step keeps step 2 and, pinned, step 1.
  tier->CollectGarbage("j", commits({1, 2}));
  EXPECT_TRUE(tier->Has("j", 1, 0));
  EXPECT_TRUE(reads_back(2));
  // Step 3's base (step 2) is dropped from the local disk's view of the tier:
  // a copy made without it on the tier stands alone.
  ASSERT_EQ(std::remove(tier->Find("j", 2, 0)->shard_path().c_str()), 0);
  data[200000] ^= 1;
  tier->Enqueue(persist(3, true));
  ASSERT_EQ(AwaitCopied(3).size(), 3u);
  EXPECT_GT(size_of(3), size_of(1) / 2) << "self-contained";
  EXPECT_TRUE(reads_back(3));
  // Step 3 kept alone: step 1 and the pin go.
  tier->CollectGarbage("j", commits({1, 2, 3}));
  EXPECT_FALSE(tier->Has("j", 1, 0));
  EXPECT_FALSE(*io::DefaultFileSystem()->Exists(pin));
  EXPECT_TRUE(reads_back(3));
}

// Another save of a step whose copy later copies store chunks in (directly
// or through each other): those are made self-contained, newest first, and
// their pins go, before the copy is replaced; every copy reads as saved.
TEST_F(SharedTierTest, AnotherSaveOfAPinnedBaseMakesItsReadersStandAlone) {
  std::unique_ptr<SharedTier> tier = Start({.keep = 8});
  ASSERT_NE(tier, nullptr);
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<uint8_t> data = testing::RandomBytes(rng, 256 << 10);
  std::map<uint64_t, std::vector<uint8_t>> saved;
  std::shared_ptr<snapshot::ShardBase> base;
  // The saves' own files: the second save of step 1 in a directory of its
  // own (bases are found beside a shard, by name).
  std::string local = dir_.File("first");
  auto persist = [&](uint64_t step, bool over_base) {
    saved[step] = data;
    return PersistInChain(local, step, data, over_base, &base);
  };
  auto reads_back = [&](uint64_t step) {
    return ReadsBack(*tier, step, saved[step]);
  };
  auto pin = [&](uint64_t of, uint64_t step) {
    return dir_.File("shared/j/" + snapshot::ShardFileName(of, 0, ".ckpt") +
                     absl::StrFormat(".base-of-%020d", step));
  };
  // Steps 1 to 3: step 3 stores chunks in 2 and 1, step 2 in 1.
  tier->Enqueue(persist(1, false));
  ASSERT_EQ(AwaitCopied(1).size(), 1u);
  for (uint64_t step : {2u, 3u}) {
    data[step * (64 << 10) + 7] ^= 1;
    tier->Enqueue(persist(step, true));
    ASSERT_EQ(AwaitCopied(step).size(), step);
  }
  ASSERT_TRUE(*io::DefaultFileSystem()->Exists(pin(1, 2)));
  ASSERT_TRUE(*io::DefaultFileSystem()->Exists(pin(2, 3)));
  ASSERT_TRUE(reads_back(3));
  // Step 1 saved again, other bytes, in full.
  data = testing::RandomBytes(rng, 256 << 10);
  local = dir_.File("again");
  tier->Enqueue(persist(1, false));
  ASSERT_EQ(AwaitCopied(4).size(), 4u);
  for (uint64_t step : {1u, 2u, 3u}) EXPECT_TRUE(reads_back(step)) << step;
  for (auto [of, step] : {std::pair{1, 2}, {1, 3}, {2, 3}}) {
    EXPECT_FALSE(*io::DefaultFileSystem()->Exists(pin(of, step)))
        << of << " of " << step;
  }
}

}  // namespace
}  // namespace ckpt::daemon
