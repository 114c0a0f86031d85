// ckptd's own cluster key (given no --cluster-key): the first ckptd makes the
// cluster's key and keeps it in the coordinator (the embedded one, or etcd);
// from then on every shard is sealed with it, every node of an etcd cluster
// agrees on it, a restart keeps it, and the steps saved before it existed
// (an upgrade from an unsealed ckptd) stay readable.
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/format.h"
#include "snapshot/manifest_seal.h"
#include "snapshot/shard_reader.h"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/daemon/etcd_process.h"
#include "tests/test_util.h"

namespace ckpt::client {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGlobal = 1 << 12;

// The key ids ckptd logged at each start ("sealed with cluster key <id>").
std::vector<std::string> KeyIds(const std::string& log) {
  const std::string marker = "sealed with cluster key ";
  std::vector<std::string> ids;
  for (size_t at = log.find(marker); at != std::string::npos;
       at = log.find(marker, at + 1)) {
    ids.push_back(log.substr(at + marker.size(), 16));
  }
  return ids;
}

// What a reader holding a key of no cluster says of the shard file: which
// key sealed it, or that it is not sealed.
std::string SealOf(const std::string& path) {
  auto foreign = snapshot::SealKeys::FromBytes(std::string(32, 'x'));
  EXPECT_TRUE(foreign.ok()) << foreign.status();
  snapshot::InstallSealKeys(*foreign);
  auto reader = snapshot::ShardReader::Open(io::DefaultFileSystem(), path);
  snapshot::InstallSealKeys(nullptr);
  return reader.ok() ? "read under a foreign key"
                     : std::string(reader.status().message());
}

std::string ShardOf(const testing::DaemonProcess& d, const std::string& job,
                    uint64_t step) {
  return d.data_dir() + "/shards/" + job + "/" +
         snapshot::ShardFileName(step, 0, ".shard");
}

TEST(ClusterKeyTest, ADaemonSealsByDefaultAndStepsSavedBeforeStayReadable) {
  // Step 1 saved by a ckptd that seals nothing.
  testing::DaemonProcess d({"--cluster-key", "none"});
  ASSERT_TRUE(d.Start()) << d.log();
  EXPECT_THAT(d.log(),
              HasSubstr("manifests are not sealed (--cluster-key none)"));
  {
    Rank r(d.socket(), "upgraded", 0, 1, kGlobal);
    ASSERT_TRUE(r.ckpt);
    absl::Status s = SaveAll({&r}, 1, proto::TIER_LOCAL_DISK);
    ASSERT_TRUE(s.ok()) << s << "\n" << d.log();
  }
  EXPECT_THAT(SealOf(ShardOf(d, "upgraded", 1)),
              HasSubstr("manifest is not sealed"));

  // The same node with the default: it makes the cluster's key, reads step 1
  // from its file (the memory tier gone, as after a reboot) and seals step 2.
  d.Kill();
  std::filesystem::remove_all(d.staging_dir());
  d.set_extra_args({});
  ASSERT_TRUE(d.Start()) << d.log();
  EXPECT_THAT(d.log(), HasSubstr("stay readable unsealed"));
  std::vector<std::string> ids = KeyIds(d.log());
  ASSERT_EQ(ids.size(), 1u) << d.log();
  {
    Rank r(d.socket(), "upgraded", 0, 1, kGlobal);
    ASSERT_TRUE(r.ckpt);
    r.Fill(99);
    absl::Status s = r.ckpt->Restore(1);
    ASSERT_TRUE(s.ok()) << s << "\n" << d.log();
    EXPECT_TRUE(r.Matches(1));
    s = SaveAll({&r}, 2, proto::TIER_LOCAL_DISK);
    ASSERT_TRUE(s.ok()) << s << "\n" << d.log();
  }
  EXPECT_THAT(SealOf(ShardOf(d, "upgraded", 2)),
              HasSubstr("manifest is sealed with cluster key " + ids[0]));

  // Step 2's file forged while the node is down (every checksum right, no
  // seal): refused at restore, by name. The key survived the restart, and
  // step 1 still restores.
  d.Kill();
  std::filesystem::remove_all(d.staging_dir());
  ASSERT_TRUE(
      WriteForged(ShardOf(d, "upgraded", 2), "upgraded", 2, kGlobal, 7.0f)
          .ok());
  ASSERT_TRUE(d.Start()) << d.log();
  ids = KeyIds(d.log());
  ASSERT_EQ(ids.size(), 2u) << d.log();
  EXPECT_EQ(ids[1], ids[0]);
  Rank r(d.socket(), "upgraded", 0, 1, kGlobal);
  ASSERT_TRUE(r.ckpt);
  r.Fill(99);
  absl::Status s = r.ckpt->Restore(2);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(r.w[0], 7.0f);
  EXPECT_THAT(d.log(), HasSubstr("manifest is not sealed"));
  s = r.ckpt->Restore(1);
  ASSERT_TRUE(s.ok()) << s << "\n" << d.log();
  EXPECT_TRUE(r.Matches(1));
}

// Two nodes on etcd agree on one key (the first to start makes it): b holds
// a's sealed replica, which it checks with the key it read, and a restart
// of either keeps it.
TEST(ClusterKeyTest, EveryNodeOfAnEtcdClusterAgreesOnOneKey) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  testing::DaemonProcess a(NodeArgs(etcd, "node-a")),
      b(NodeArgs(etcd, "node-b"));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  const std::vector<std::string> at_a = KeyIds(a.log());
  ASSERT_EQ(at_a.size(), 1u) << a.log();
  EXPECT_EQ(KeyIds(b.log()), at_a) << b.log();
  EXPECT_THAT(b.log(), HasSubstr("made by node-a"));
  Rank r(a.socket(), "agreed", 0, 1, kGlobal);
  ASSERT_TRUE(r.ckpt);
  absl::Status s = SaveAll({&r}, 1, proto::TIER_PEER);
  ASSERT_TRUE(s.ok()) << s << "\n" << a.log() << b.log();
  b.Kill();
  ASSERT_TRUE(b.Start()) << b.log();
  const std::vector<std::string> at_b = KeyIds(b.log());
  ASSERT_EQ(at_b.size(), 2u) << b.log();
  EXPECT_EQ(at_b[1], at_a[0]);
}

}  // namespace
}  // namespace ckpt::client
