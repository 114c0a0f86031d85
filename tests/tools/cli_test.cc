// The `ckpt` command as operators run it: a real process, its exit code and its
// output.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/manifest_seal.h"
#include "tests/snapshot/sample_shard.h"
#include "tests/test_util.h"
#include "tests/tools/run_cli.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = testing::TestSeed();
    sample_ = std::make_unique<testing::SampleShard>(seed_);
    path_ = dir_.File("s.shard");
    ASSERT_TRUE(sample_->Write(io::DefaultFileSystem(), path_, 5).ok());
  }
  uint64_t seed_;
  testing::TempDir dir_;
  std::unique_ptr<testing::SampleShard> sample_;
  std::string path_;
};

TEST_F(CliTest, InspectShowsItemsHumanAndJson) {
  Result human = RunCli("inspect " + path_);
  EXPECT_EQ(human.exit_code, 0) << human.out;
  EXPECT_THAT(human.out, HasSubstr("step 5"));
  EXPECT_THAT(human.out, HasSubstr("float32 [12000] box [6000]+[6000]"));
  Result json = RunCli("inspect --json " + path_);
  ASSERT_EQ(json.exit_code, 0) << json.out;
  nlohmann::json j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["step"], 5);
  EXPECT_EQ(j["items"].size(), 4u);
  EXPECT_EQ(j["items"][0]["name"], "w");
  EXPECT_EQ(j["items"][0]["dtype"], "float32");
  EXPECT_EQ(j["items"][0]["raw_size"], 24000);
}

TEST_F(CliTest, VerifyPassesAnIntactShard) {
  Result r = RunCli("verify " + path_);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("OK"));
  EXPECT_THAT(r.out, HasSubstr("10 chunks verified"));
}

// --cluster-key: a shard sealed with the key passes, one sealed with another
// key or not at all is named BAD; without the key only checksums are checked.
TEST_F(CliTest, VerifyChecksSealsWithTheClusterKey) {
  auto key_file = [&](const std::string& name, char fill) {
    const std::string path = dir_.File(name);
    testing::WriteAll(path, std::string(32, fill));
    ::chmod(path.c_str(), 0600);
    return path;
  };
  const std::string ours = key_file("ours.key", 'o');
  const std::string theirs = key_file("theirs.key", 't');
  const std::string sealed = dir_.File("sealed.shard");
  snapshot::InstallSealKeys(*snapshot::SealKeys::Load(ours));
  ASSERT_TRUE(sample_->Write(io::DefaultFileSystem(), sealed, 5).ok());
  snapshot::InstallSealKeys(nullptr);

  Result ok = RunCli("verify --cluster-key " + ours + " " + sealed);
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_THAT(ok.out, HasSubstr("10 chunks verified and its seal"));
  Result other = RunCli("verify --cluster-key " + theirs + " " + sealed);
  EXPECT_EQ(other.exit_code, 1) << other.out;
  EXPECT_THAT(other.out, HasSubstr("BAD"));
  EXPECT_THAT(other.out, HasSubstr("seal"));
  // During a rotation the old key still checks.
  Result rotating = RunCli("verify --cluster-key " + theirs +
                           " --cluster-key-old " + ours + " " + sealed);
  EXPECT_EQ(rotating.exit_code, 0) << rotating.out;
  // The unsealed sample is refused under a key, passes without one.
  Result unsealed = RunCli("verify --cluster-key " + ours + " " + path_);
  EXPECT_EQ(unsealed.exit_code, 1) << unsealed.out;
  EXPECT_EQ(RunCli("verify " + path_).exit_code, 0);
  // A key file others may read is refused before anything is checked.
  ::chmod(ours.c_str(), 0644);
  Result loose = RunCli("verify --cluster-key " + ours + " " + sealed);
  EXPECT_NE(loose.exit_code, 0);
  EXPECT_THAT(loose.out, HasSubstr("ours.key"));
}

TEST_F(CliTest, VerifyExitsOneWithALinePerBadChunk) {
  const std::string original = testing::ReadAll(path_);
  auto reader = snapshot::ShardReader::Open(io::DefaultFileSystem(), path_);
  ASSERT_TRUE(reader.ok());
  const auto& w = (*reader)->manifest().items(0);
  ASSERT_GE(w.chunks_size(), 3);
  // Damage the stored bytes of chunks 0 and 2 of "w".
  std::string damaged = original;
  for (int c : {0, 2}) damaged[w.chunks(c).file_offset() + 64 + 10] ^= 0x5a;
  testing::WriteAll(path_, damaged);
  Result r = RunCli("verify " + path_);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("item \"w\" chunk 0 at file offset"));
  EXPECT_THAT(r.out, HasSubstr("item \"w\" chunk 2 at file offset"));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  Result j = RunCli("verify --json " + path_);
  EXPECT_EQ(j.exit_code, 1);
  EXPECT_EQ(nlohmann::json::parse(j.out)["errors"].size(), 2u);
}

// An incremental shard: inspect names its base, verify checks the chunks
// stored there and names a missing base precisely.
TEST_F(CliTest, IncrementalShardsShowTheirBaseAndAMissingOneIsNamed) {
  const std::string base = dir_.File("00000000000000000005-0000000000.shard");
  const std::string next = dir_.File("00000000000000000006-0000000000.shard");
  ASSERT_TRUE(sample_->Write(io::DefaultFileSystem(), base, 5).ok());
  testing::SampleShard changed(seed_);
  changed.items["rng"][0] ^= 1;  // only the byte item changes
  ASSERT_TRUE(changed.Write(io::DefaultFileSystem(), next, 6, base).ok());
  Result human = RunCli("inspect " + next);
  ASSERT_EQ(human.exit_code, 0) << human.out;
  EXPECT_THAT(human.out, HasSubstr("unchanged chunks stay in steps 5"));
  Result json = RunCli("inspect --json " + next);
  ASSERT_EQ(json.exit_code, 0) << json.out;
  nlohmann::json j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j["bases"].size(), 1u);
  EXPECT_EQ(j["bases"][0]["step"], 5);
  EXPECT_EQ(j["bases"][0]["path"], base);
  EXPECT_EQ(j["increments"], 1);
  Result ok = RunCli("verify " + next);
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_THAT(ok.out, HasSubstr("10 chunks verified"));

  ASSERT_EQ(std::remove(base.c_str()), 0);
  Result bad = RunCli("verify " + next);
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_THAT(bad.out,
              HasSubstr("base shard step 5 (" + base + ") is missing"));
  EXPECT_THAT(bad.out, HasSubstr("\"w\""));
}

TEST_F(CliTest, VerifyDetectsSampledSingleByteFlips) {
  // Every byte is covered in-process by the corruption test; here a seeded
  // sample of positions (and the whole footer) through the real command.
  const std::string original = testing::ReadAll(path_);
  std::mt19937_64 rng(seed_);
  std::vector<size_t> positions;
  for (size_t i = original.size() - 64; i < original.size(); i += 7)
    positions.push_back(i);
  for (int i = 0; i < 40; ++i) positions.push_back(rng() % original.size());
  for (size_t pos : positions) {
    std::string damaged = original;
    damaged[pos] ^= static_cast<char>(1 + rng() % 255);
    testing::WriteAll(path_, damaged);
    Result r = RunCli("verify " + path_);
    EXPECT_EQ(r.exit_code, 1)
        << "flip at " << pos << " not reported: " << r.out;
    EXPECT_THAT(r.out, HasSubstr("BAD"));
  }
}

TEST_F(CliTest, WithoutIoUringFallsBackWithAWarning) {
  Result r = RunCli("verify " + path_, "CKPT_DISABLE_IO_URING=1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("using pwrite/pread"));
  EXPECT_THAT(r.out, HasSubstr("10 chunks verified"));
}

TEST_F(CliTest, BadInputGetsAClearErrorAndNonZeroExit) {
  Result missing = RunCli("verify " + dir_.File("nope.shard"));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.out, HasSubstr("nope.shard"));
  testing::WriteAll(dir_.File("junk"), std::string(8192, 'j'));
  Result junk = RunCli("inspect " + dir_.File("junk"));
  EXPECT_EQ(junk.exit_code, 1);
  EXPECT_THAT(junk.out, HasSubstr("not a ckpt shard file"));
  EXPECT_EQ(RunCli("frobnicate").exit_code, 2);
  EXPECT_EQ(RunCli("verify").exit_code, 2);
}

}  // namespace
}  // namespace ckpt
