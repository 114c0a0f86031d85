#include "daemon/catalog/catalog.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

proto::ShardRecord Shard(const std::string& job, uint64_t step, uint32_t rank,
                         proto::ShardState state) {
  proto::ShardRecord r;
  r.set_job(job);
  r.set_step(step);
  r.set_rank(rank);
  r.set_world_size(2);
  r.set_state(state);
  return r;
}

TEST(CatalogTest, ShardsAndJobsSurviveAReopenInStepOrder) {
  testing::TempDir dir;
  {
    auto store = KvStore::Open(dir.File("db"));
    ASSERT_TRUE(store.ok());
    Catalog catalog(store->get());
    proto::JobRecord job;
    job.set_job("a");
    job.set_world_size(2);
    ASSERT_TRUE(catalog.PutJob(job).ok());
    // Inserted out of order; steps 9 and 10 must sort numerically.
    ASSERT_TRUE(catalog.PutShard(Shard("a", 10, 1, proto::SHARD_STAGED)).ok());
    ASSERT_TRUE(
        catalog.PutShard(Shard("a", 9, 0, proto::SHARD_PERSISTED)).ok());
    ASSERT_TRUE(catalog.PutShard(Shard("a", 10, 0, proto::SHARD_STAGING)).ok());
    ASSERT_TRUE(catalog.PutShard(Shard("ab", 1, 0, proto::SHARD_STAGED)).ok());
  }
  auto store = KvStore::Open(dir.File("db"));
  ASSERT_TRUE(store.ok());
  Catalog catalog(store->get());
  auto shards = catalog.ListShards("a");
  ASSERT_TRUE(shards.ok());
  ASSERT_EQ(shards->size(), 3u) << "job \"ab\" is not part of job \"a\"";
  EXPECT_EQ((*shards)[0].step(), 9u);
  EXPECT_EQ((*shards)[1].step(), 10u);
  EXPECT_EQ((*shards)[1].rank(), 0u);
  EXPECT_EQ((*shards)[2].state(), proto::SHARD_STAGED);
  EXPECT_EQ(catalog.ListShards()->size(), 4u);
  auto one = catalog.GetShard("a", 9, 0);
  ASSERT_TRUE(one.ok() && one->has_value());
  EXPECT_EQ((*one)->state(), proto::SHARD_PERSISTED);
  ASSERT_TRUE(catalog.DeleteShard("a", 9, 0).ok());
  EXPECT_FALSE(catalog.GetShard("a", 9, 0)->has_value());
  auto job = catalog.GetJob("a");
  ASSERT_TRUE(job.ok() && job->has_value());
  EXPECT_EQ((*job)->world_size(), 2u);
  EXPECT_EQ(catalog.ListJobs()->size(), 1u);
}

}  // namespace
}  // namespace ckpt::daemon
