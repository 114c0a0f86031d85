// The shared tier on an object store (--shared-uri s3://bucket/prefix),
// across real ckptd processes on etcd against a real S3 server (SeaweedFS on
// loopback): increments and their pins go up, a lost node's ranks restore
// bit-exact from the bucket alone; wrong credentials leave the steps at the
// lower tiers with an error naming the bucket and the HTTP status; the
// server killed in the middle of uploads and started again leaves no upload
// open and the copies complete.
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/s3/s3_client.h"
#include "io/s3/s3_file_system.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/daemon/etcd_process.h"
#include "tests/io/s3/test_server.h"
#include "tests/test_util.h"
#include "tests/tools/run_cli.h"
#include "tests/tools/safetensors_file.h"

namespace ckpt::client {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr proto::Tier kShared = proto::TIER_SHARED;

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

class ObjectTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = io::s3::S3Client::Create(io::s3::TestOptions());
    ASSERT_TRUE(c.ok());
    client_ = *std::move(c);
    ASSERT_TRUE(client_->CreateBucket("ckpt-test").ok());
    prefix_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    WriteCredentials(io::s3::TestServer().secret_key());
  }
  void WriteCredentials(const std::string& secret) {
    testing::WriteAll(dir_.File("credentials"),
                      absl::StrCat("[default]\naws_access_key_id = ",
                                   io::s3::TestServer().access_key(),
                                   "\naws_secret_access_key = ", secret, "\n"));
  }
  // ckptd's flags for the shared tier in the bucket.
  std::vector<std::string> TierArgs() const {
    return {"--shared-uri",          "s3://ckpt-test/" + prefix_,
            "--s3-endpoint",         io::s3::TestServer().endpoint(),
            "--s3-credentials-file", dir_.File("credentials"),
            "--s3-part-mib",         "5",
            "--shared-every",        "1",
            "--keep-shared",         "4"};
  }
  std::vector<std::string> Keys() {
    auto listed = client_->ListObjects("ckpt-test", prefix_ + "/");
    std::vector<std::string> keys;
    if (listed.ok()) {
      for (const io::s3::ObjectInfo& o : *listed) {
        keys.push_back(o.key.substr(prefix_.size() + 1));
      }
    }
    return keys;
  }

  // Bytes node `d` read from the bucket into landed copies.
  static double LandedBytes(testing::DaemonProcess& d) {
    absl::StatusOr<std::string> text = GetMetricsText(d.socket());
    EXPECT_TRUE(text.ok()) << text.status();
    const std::string kName = "\nckpt_shared_landed_bytes_total ";
    const size_t at = text.ok() ? text->find(kName) : std::string::npos;
    double v = 0;
    if (at != std::string::npos) {
      const size_t end = text->find('\n', at + 1);
      const std::string value =
          text->substr(at + kName.size(), end - at - kName.size());
      EXPECT_TRUE(absl::SimpleAtod(value, &v)) << "\"" << value << "\"";
    }
    return v;
  }

  std::shared_ptr<io::s3::S3Client> client_;
  std::string prefix_;
  testing::TempDir dir_;
};

// Two nodes on etcd copy every step to the bucket; node a, with both ranks,
// is lost with its directories; node b restores every kept step from the
// bucket alone, increments through their bases there.
TEST_F(ObjectTierTest, ALostNodesStepsRestoreFromTheBucket) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  auto node = [&](const std::string& id) {
    std::vector<std::string> args = etcd.DaemonArgs();
    args.insert(args.end(), {"--lease-ttl", "2", "--node-id", id});
    std::vector<std::string> tier = TierArgs();
    args.insert(args.end(), tier.begin(), tier.end());
    return args;
  };
  testing::DaemonProcess a(node("node-a")), b(node("node-b"));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  constexpr int64_t kGlobal = 2 * (3 << 20);  // 12 MiB per rank
  {
    Rank r0(a.socket(), "obj", 0, 2, kGlobal),
        r1(a.socket(), "obj", 1, 2, kGlobal);
    ASSERT_TRUE(r0.ckpt && r1.ckpt);
    for (uint64_t step = 1; step <= 3; ++step) {
      absl::Status s = SaveAll({&r0, &r1}, step, kShared);
      ASSERT_TRUE(s.ok()) << s << "\n" << a.log();
    }
  }
  const std::vector<std::string> keys = Keys();
  EXPECT_THAT(
      keys, ::testing::IsSupersetOf({"obj/00000000000000000003-0000000000.ckpt",
                                     "obj/00000000000000000003-0000000001.ckpt",
                                     "obj/00000000000000000003.commit"}));
  EXPECT_THAT(a.log(), HasSubstr("s3://ckpt-test/" + prefix_));
  a.Lose();
  // Onto 8 ranks, rank 0 reads a quarter of saved rank 0's box: only the
  // chunks holding it land from the bucket; rank 0 of 2 then lands the rest.
  const double before = LandedBytes(b);
  {
    Rank eighth(b.socket(), "obj", 0, 8, kGlobal);
    ASSERT_TRUE(eighth.ckpt);
    absl::Status restored = eighth.ckpt->Restore(3);
    ASSERT_TRUE(restored.ok()) << restored << "\n" << b.log();
    EXPECT_TRUE(eighth.Matches(3, /*rng_too=*/false));
  }
  const double part = LandedBytes(b) - before;
  for (uint64_t step : {3u, 2u}) {
    for (uint32_t rank : {0u, 1u}) {
      Rank r(b.socket(), "obj", rank, 2, kGlobal);
      ASSERT_TRUE(r.ckpt);
      absl::Status restored = r.ckpt->Restore(step);
      ASSERT_TRUE(restored.ok()) << restored << "\n" << b.log();
      EXPECT_TRUE(r.Matches(step)) << "step " << step << " rank " << rank;
    }
  }
  EXPECT_THAT(b.log(), ContainsRegex("landing [^ ]+ \\([0-9]+ bytes\\) from "
                                     "s3://ckpt-test/"));
  // Steps 3 and 2 of both ranks landed whole: saved rank 0's step 3 once.
  const double whole = LandedBytes(b) - before;
  EXPECT_GT(part, 0);
  EXPECT_LT(part, whole / 8) << "the resharded restore landed only its part";
  auto open = client_->ListMultipartUploads("ckpt-test", prefix_ + "/");
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->empty());
}

// A new cluster (a fresh data directory, its coordinator knowing nothing of
// the job) restores from the bucket alone: the commit markers say what is
// committed, the copies (an increment through its base) are landed.
TEST_F(ObjectTierTest, AFreshClusterRestoresFromTheBucketAlone) {
  constexpr int64_t kGlobal = 3 << 20;  // 12 MiB, one rank
  // The operators' cluster key, given to both clusters (a key a cluster made
  // for itself would leave the new one unable to check the seals).
  const std::string key = dir_.File("cluster.key");
  testing::WriteAll(key, std::string(64, 'c') + "\n");
  ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
  std::vector<std::string> args = TierArgs();
  args.insert(args.end(), {"--cluster-key", key});
  {
    testing::DaemonProcess old(args);
    ASSERT_TRUE(old.Start()) << old.log();
    Rank r0(old.socket(), "cold", 0, 1, kGlobal);
    ASSERT_TRUE(r0.ckpt);
    for (uint64_t step = 1; step <= 2; ++step) {
      absl::Status s = SaveAll({&r0}, step, kShared);
      ASSERT_TRUE(s.ok()) << s << "\n" << old.log();
    }
    // The marker follows the commit (written by the node that completed it).
    for (int i = 0;
         i < 200 && !Contains(Keys(), "cold/" + snapshot::CommitMarkerName(2));
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    old.Lose();
  }
  testing::DaemonProcess fresh(args);
  ASSERT_TRUE(fresh.Start()) << fresh.log();
  Rank r0(fresh.socket(), "cold", 0, 1, kGlobal);
  ASSERT_TRUE(r0.ckpt);
  for (uint64_t step : {2u, 1u}) {
    absl::Status restored = r0.ckpt->Restore(step);
    ASSERT_TRUE(restored.ok()) << restored << "\n" << fresh.log();
    EXPECT_TRUE(r0.Matches(step)) << "step " << step;
  }
  absl::Status missing = r0.ckpt->Restore(3);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.message(), HasSubstr("step 3"));

  // The operators' commands read the bucket directly, no ckptd asked.
  const std::string s3 =
      absl::StrCat("--s3-endpoint ", io::s3::TestServer().endpoint(),
                   " --s3-credentials-file ", dir_.File("credentials"), " ");
  const std::string job = "s3://ckpt-test/" + prefix_ + "/cold";
  Result jobs = RunCli(s3 + "ls s3://ckpt-test/" + prefix_);
  EXPECT_EQ(jobs.exit_code, 0) << jobs.out;
  EXPECT_THAT(jobs.out, HasSubstr("cold: committed steps 1, 2"));
  Result steps = RunCli(s3 + "ls " + job + " --json");
  ASSERT_EQ(steps.exit_code, 0) << steps.out;
  EXPECT_THAT(steps.out, ContainsRegex("\"committed\": true"));
  Result inspected = RunCli(s3 + "inspect " + job + "/" +
                            snapshot::ShardFileName(2, 0, ".ckpt") + " --json");
  ASSERT_EQ(inspected.exit_code, 0) << inspected.out;
  EXPECT_THAT(inspected.out, HasSubstr("\"model/w\""));
  Result good = RunCli(s3 + "verify " + job + " --cluster-key " + key);
  EXPECT_EQ(good.exit_code, 0) << good.out;
  EXPECT_THAT(good.out, HasSubstr("2 copies verified with their seals"));
  // Exported from the bucket as full tensors.
  const std::string out = dir_.File("cold-2.safetensors");
  Result exported = RunCli(s3 + "export " + job + " 2 " + out);
  ASSERT_EQ(exported.exit_code, 0) << exported.out;
  testing::SafetensorsFile f = testing::SafetensorsFile::Read(out);
  EXPECT_EQ(f.header["model/w"]["shape"], nlohmann::json::array({kGlobal}));
  const std::string w = f.Bytes("model/w");
  ASSERT_EQ(w.size(), kGlobal * sizeof(float));
  bool exact = true;
  for (int64_t i = 0; i < kGlobal && exact; ++i) {
    float v;
    std::memcpy(&v, w.data() + i * sizeof(float), sizeof v);
    exact = v == Value(2, i);
  }
  EXPECT_TRUE(exact) << "the exported tensor differs from step 2's";
  Result uncommitted = RunCli(s3 + "export " + job + " 3 " + out);
  EXPECT_EQ(uncommitted.exit_code, 3) << uncommitted.out;  // not found
  EXPECT_THAT(uncommitted.out, HasSubstr("step 3 is not committed in"));
  // Retention on the bucket: step 1 goes, marker first; step 2 stays whole.
  // An upload a lost node left open goes too, once it is old enough.
  absl::StatusOr<std::string> stray =
      client_->CreateMultipartUpload("ckpt-test", prefix_ + "/cold/stray");
  ASSERT_TRUE(stray.ok()) << stray.status();
  Result would = RunCli(s3 + "gc " + job + " --keep 1 --dry-run");
  EXPECT_EQ(would.exit_code, 0) << would.out;
  EXPECT_THAT(would.out, HasSubstr("would drop"));
  EXPECT_THAT(would.out, Not(HasSubstr("upload")));  // begun just now
  EXPECT_TRUE(Contains(Keys(), "cold/" + snapshot::CommitMarkerName(1)));
  Result collected =
      RunCli(s3 + "gc " + job + " --keep 1 --stale-uploads-min 0");
  EXPECT_EQ(collected.exit_code, 0) << collected.out;
  EXPECT_THAT(collected.out, HasSubstr("steps 1 dropped"));
  EXPECT_THAT(collected.out, HasSubstr("aborted 1 upload(s) left open"));
  auto open_uploads =
      client_->ListMultipartUploads("ckpt-test", prefix_ + "/cold/");
  ASSERT_TRUE(open_uploads.ok()) << open_uploads.status();
  EXPECT_TRUE(open_uploads->empty());
  EXPECT_FALSE(Contains(Keys(), "cold/" + snapshot::CommitMarkerName(1)));
  EXPECT_FALSE(
      Contains(Keys(), "cold/" + snapshot::ShardFileName(1, 0, ".ckpt")));
  Result after = RunCli(s3 + "verify " + job);
  EXPECT_EQ(after.exit_code, 0) << after.out;
  EXPECT_THAT(after.out, HasSubstr("1 copies verified"));
  // A flipped byte in step 2's copy is found and named.
  const std::string key2 =
      prefix_ + "/cold/" + snapshot::ShardFileName(2, 0, ".ckpt");
  absl::StatusOr<std::string> bytes = client_->GetObject("ckpt-test", key2);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() / 3] ^= 0x10;
  ASSERT_TRUE(
      client_
          ->PutObject("ckpt-test", key2,
                      absl::MakeConstSpan(
                          reinterpret_cast<const uint8_t*>(bytes->data()),
                          bytes->size()))
          .ok());
  Result bad = RunCli(s3 + "verify " + job + " 2");
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_THAT(bad.out, HasSubstr("BAD step 2 rank 0"));
  // A marker forged to name a world of 2^30 ranks is refused, naming it,
  // before anything is sized by it.
  proto::CommitRecord forged;
  forged.set_job("cold");
  forged.set_step(7);
  forged.set_world_size(1u << 30);
  const std::string forged_bytes = forged.SerializeAsString();
  ASSERT_TRUE(
      client_
          ->PutObject("ckpt-test",
                      prefix_ + "/cold/" + snapshot::CommitMarkerName(7),
                      absl::MakeConstSpan(
                          reinterpret_cast<const uint8_t*>(forged_bytes.data()),
                          forged_bytes.size()))
          .ok());
  for (const std::string& command :
       {"ls " + job, "verify " + job + " 7", "export " + job + " 7 " + out}) {
    Result refused = RunCli(s3 + command);
    EXPECT_NE(refused.exit_code, 0) << command << "\n" << refused.out;
    EXPECT_THAT(refused.out, HasSubstr("names a world of 1073741824 ranks"))
        << command;
  }
}

// Wrong credentials: the steps commit at the lower tiers, never at the
// shared one, and ckptd's log names the bucket, the key and the HTTP status.
TEST_F(ObjectTierTest, WrongCredentialsLeaveTheStepsAtTheLowerTiers) {
  WriteCredentials("not-the-secret");
  std::vector<std::string> args = TierArgs();
  testing::DaemonProcess a(args);
  ASSERT_TRUE(a.Start()) << a.log();
  Rank r0(a.socket(), "cred", 0, 1, 1 << 18);
  ASSERT_TRUE(r0.ckpt);
  absl::Status s = SaveAll({&r0}, 1, proto::TIER_LOCAL_DISK);
  ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < 200 && a.log().find("HTTP 403") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(a.log(), HasSubstr("s3://ckpt-test/" + prefix_ + "/cred/"));
  EXPECT_THAT(a.log(), HasSubstr("HTTP 403"));
  auto shared = r0.ckpt->ListCommitted(kShared);
  ASSERT_TRUE(shared.ok());
  EXPECT_TRUE(shared->empty());
  auto disk = r0.ckpt->ListCommitted(proto::TIER_LOCAL_DISK);
  ASSERT_TRUE(disk.ok());
  EXPECT_THAT(*disk, ::testing::ElementsAre(1u));
  EXPECT_TRUE(Keys().empty());
}

// The server is SIGKILLed while a step's copies go up and started again: the
// copies are tried again and complete, no upload is left open, and the copy
// in the bucket holds the step.
TEST_F(ObjectTierTest, TheServerKilledMidUploadComesBackAndTheCopiesComplete) {
  testing::DaemonProcess a(TierArgs());
  ASSERT_TRUE(a.Start()) << a.log();
  constexpr int64_t kGlobal = 16 << 20;  // 64 MiB: thirteen 5 MiB parts
  Rank r0(a.socket(), "kill", 0, 1, kGlobal);
  ASSERT_TRUE(r0.ckpt);
  r0.Fill(1);
  auto save = r0.ckpt->SaveAsync(1);
  ASSERT_TRUE(save.ok());
  ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
  io::s3::TestServer().Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_TRUE(io::s3::TestServer().Start());
  absl::Status up = (*save)->WaitCommitted(kShared, absl::Seconds(60));
  ASSERT_TRUE(up.ok()) << up << "\n" << a.log();
  auto open = client_->ListMultipartUploads("ckpt-test", prefix_ + "/");
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->empty());
  // The copy in the bucket holds the step, every chunk checked as read.
  io::s3::S3FileSystem fs(client_);
  auto reader = snapshot::ShardReader::Open(
      &fs, absl::StrCat("s3://ckpt-test/", prefix_,
                        "/kill/00000000000000000001-0000000000.ckpt"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> w(kGlobal);
  ASSERT_TRUE(
      (*reader)
          ->ReadItem("model/w",
                     absl::MakeSpan(reinterpret_cast<uint8_t*>(w.data()),
                                    w.size() * sizeof(float)))
          .ok());
  EXPECT_TRUE(w == r0.w);
}

}  // namespace
}  // namespace ckpt::client
