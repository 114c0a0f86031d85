// Sealed manifests: a shard written under a cluster key reads back under that
// key (and by readers without a key), and nowhere else; a shard written
// without the key, or whose seal was rewritten with every checksum recomputed
// (what an attacker without the key can do), is refused by name; rotations
// read the old key's shards; copies rewritten self-contained are sealed anew.
#include "snapshot/manifest_seal.h"

#include <sys/stat.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/format.h"
#include "snapshot/self_contained.h"
#include "tests/snapshot/sample_shard.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const SealKeys> Keys(char fill,
                                     std::vector<std::string> old = {}) {
  auto keys = SealKeys::FromBytes(std::string(32, fill), old);
  EXPECT_TRUE(keys.ok()) << keys.status();
  return *keys;
}

class ManifestSealTest : public ::testing::Test {
 protected:
  void TearDown() override { InstallSealKeys(nullptr); }
  absl::Status Write(const std::string& path, uint64_t step = 1,
                     const std::string& base = "") {
    return sample_.Write(io::DefaultFileSystem(), path, step, base);
  }
  absl::Status Check(const std::string& path) {
    return sample_.Check(io::DefaultFileSystem(), path);
  }
  testing::SampleShard sample_{testing::TestSeed()};
  testing::TempDir dir_;
};

TEST_F(ManifestSealTest, ASealedShardReadsBackUnderItsKeysOnly) {
  const std::string path = dir_.File(ShardFileName(1, 0, ".shard"));
  InstallSealKeys(Keys('a'));
  ASSERT_TRUE(Write(path).ok());
  absl::Status s = Check(path);
  EXPECT_TRUE(s.ok()) << s;
  // A reader that knows no key reads it too.
  InstallSealKeys(nullptr);
  s = Check(path);
  EXPECT_TRUE(s.ok()) << s;
  // Another cluster's key does not.
  InstallSealKeys(Keys('b'));
  s = Check(path);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("manifest is sealed with cluster key ",
                                     Keys('a')->current_id(),
                                     ", which this node does not hold")));
  // A rotation: b seals, a is still read.
  InstallSealKeys(Keys('b', {std::string(32, 'a')}));
  s = Check(path);
  EXPECT_TRUE(s.ok()) << s;
  const std::string next = dir_.File(ShardFileName(2, 0, ".shard"));
  ASSERT_TRUE(Write(next, 2).ok());
  InstallSealKeys(Keys('b'));
  s = Check(next);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(ManifestSealTest,
       ShardsWithoutAValidSealAreRefusedThoughTheirChecksumsHold) {
  const std::string path = dir_.File(ShardFileName(1, 0, ".shard"));
  ASSERT_TRUE(Write(path).ok());  // no key: every checksum right, no seal
  InstallSealKeys(Keys('a'));
  absl::Status s = Check(path);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("manifest is not sealed"));

  // Sealed, then its MAC rewritten and the footer's checksums recomputed:
  // every xxh3 holds, the seal does not.
  ASSERT_TRUE(Write(path).ok());
  std::string bytes = testing::ReadAll(path);
  auto* tail =
      reinterpret_cast<uint8_t*>(bytes.data()) + bytes.size() - kFooterSize;
  auto footer = DecodeFooter({tail, kFooterSize});
  ASSERT_TRUE(footer.ok()) << footer.status();
  bytes[footer->manifest_offset + footer->manifest_size - 1] ^= 0x5a;
  footer->manifest_xxh3 = Checksum(
      {reinterpret_cast<const uint8_t*>(bytes.data()) + footer->manifest_offset,
       footer->manifest_size});
  EncodeFooter(*footer, tail);
  testing::WriteAll(path, bytes);
  s = Check(path);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("manifest seal does not match under "
                                     "cluster key ",
                                     Keys('a')->current_id(),
                                     ": the shard was altered or forged")));
}

// Keys turned on over checkpoints saved without one: the steps saved before
// (per job) stay readable unsealed; a later step, or another job's, must be
// sealed; a sealed one checks as always.
TEST_F(ManifestSealTest, StepsSavedBeforeTheKeyExistedStayReadableUnsealed) {
  const std::string old_step = dir_.File(ShardFileName(1, 0, ".shard"));
  const std::string new_step = dir_.File(ShardFileName(2, 0, ".shard"));
  ASSERT_TRUE(Write(old_step, 1).ok());  // no key yet
  ASSERT_TRUE(Write(new_step, 2).ok());
  auto keys = SealKeys::FromBytes(std::string(32, 'a'), {}, {{"job", 1}});
  ASSERT_TRUE(keys.ok()) << keys.status();
  InstallSealKeys(*keys);
  absl::Status s = Check(old_step);
  EXPECT_TRUE(s.ok()) << s;
  s = Check(new_step);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("manifest is not sealed"));
  // Another job's step 1 was not saved before the key.
  keys = SealKeys::FromBytes(std::string(32, 'a'), {}, {{"other", 5}});
  ASSERT_TRUE(keys.ok()) << keys.status();
  InstallSealKeys(*keys);
  s = Check(old_step);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  // A step written now is sealed and checks.
  InstallSealKeys(Keys('a'));
  ASSERT_TRUE(Write(new_step, 2).ok());
  InstallSealKeys(*keys);
  s = Check(new_step);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(ManifestSealTest, SelfContainedCopiesOfIncrementalShardsAreSealedAnew) {
  InstallSealKeys(Keys('a'));
  const std::string base = dir_.File(ShardFileName(1, 0, ".shard"));
  const std::string incremental = dir_.File(ShardFileName(2, 0, ".shard"));
  ASSERT_TRUE(Write(base).ok());
  ASSERT_TRUE(Write(incremental, 2, base).ok());
  auto view = OpenSelfContained(io::DefaultFileSystem(), incremental);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE(view->incremental);
  const std::string copy = dir_.File("copy.shard");
  ASSERT_TRUE(WriteSelfContained(io::DefaultFileSystem(), *view, copy).ok());
  absl::Status s = Check(copy);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(ManifestSealTest, KeysAreLongEnoughAndTheirFilesPrivate) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      SealKeys::FromBytes(std::string(31, 'k')).status()));
  const std::string file = dir_.File("cluster.key");
  testing::WriteAll(file, std::string(64, 'f') + "\n");
  ::chmod(file.c_str(), 0644);
  auto loaded = SealKeys::Load(file);
  EXPECT_TRUE(absl::IsPermissionDenied(loaded.status())) << loaded.status();
  EXPECT_THAT(loaded.status().message(), HasSubstr("chmod 600"));
  ::chmod(file.c_str(), 0600);
  loaded = SealKeys::Load(file);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // The trailing newline is not key material.
  EXPECT_EQ((*loaded)->current_id(),
            (*SealKeys::FromBytes(std::string(64, 'f')))->current_id());
  EXPECT_TRUE(absl::IsNotFound(SealKeys::Load(dir_.File("none")).status()));
}

}  // namespace
}  // namespace ckpt::snapshot
