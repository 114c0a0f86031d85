// S3Client against a real S3 server (SeaweedFS on loopback, one for the whole
// binary, a bucket per test): objects whole and by range, landing in place,
// listings across pages, multipart uploads of odd sizes assembled bit-exact,
// uploads aborted and listed, and the errors: a missing key, a range past the
// end, wrong credentials (not retried), a server that does not answer
// (retried, then named). Randomized bytes print their seed.
#include "io/s3/s3_client.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/io/s3/test_server.h"
#include "tests/test_util.h"
#include "tools/fault_proxy.h"
#include "tools/local_s3.h"
#include "tools/process.h"

namespace ckpt::io::s3 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

S3Options Options() { return TestOptions(); }

class S3ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<S3Client>> c = S3Client::Create(Options());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    // One bucket (made again: that is no error), a prefix per test.
    absl::Status made = client_->CreateBucket(bucket_);
    ASSERT_TRUE(made.ok()) << made;
    prefix_ = absl::StrCat(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "/");
  }
  // `key` under the test's prefix.
  std::string K(absl::string_view key) const {
    return absl::StrCat(prefix_, key);
  }
  std::vector<uint8_t> Bytes(size_t n) { return testing::RandomBytes(rng_, n); }
  static std::string AsString(const std::vector<uint8_t>& v) {
    return std::string(v.begin(), v.end());
  }

  std::unique_ptr<S3Client> client_;
  const std::string bucket_ = "ckpt-test";
  std::string prefix_;
  std::mt19937_64 rng_{testing::TestSeed()};
};

TEST_F(S3ClientTest, ObjectsRoundTripWholeAndAreListedAndDeleted) {
  std::vector<std::vector<uint8_t>> objects = {Bytes(0), Bytes(1),
                                               Bytes((1 << 20) + 3)};
  for (size_t i = 0; i < objects.size(); ++i) {
    absl::Status put = client_->PutObject(
        bucket_, K(absl::StrCat("job/step 1/", i, ".ckpt")), objects[i]);
    ASSERT_TRUE(put.ok()) << put;
  }
  ASSERT_TRUE(client_->PutObject(bucket_, K("other/x"), Bytes(5)).ok());
  for (size_t i = 0; i < objects.size(); ++i) {
    const std::string key = K(absl::StrCat("job/step 1/", i, ".ckpt"));
    absl::StatusOr<std::string> got = client_->GetObject(bucket_, key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, AsString(objects[i])) << key;
    absl::StatusOr<ObjectInfo> head = client_->HeadObject(bucket_, key);
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(head->size, objects[i].size());
  }
  absl::StatusOr<std::vector<ObjectInfo>> listed =
      client_->ListObjects(bucket_, K("job/"));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[2].key, K("job/step 1/2.ckpt"));
  EXPECT_EQ((*listed)[2].size, objects[2].size());
  ASSERT_TRUE(client_->DeleteObject(bucket_, K("job/step 1/1.ckpt")).ok());
  EXPECT_TRUE(client_->DeleteObject(bucket_, K("job/step 1/1.ckpt")).ok())
      << "deleting what is gone";
  absl::Status missing =
      client_->HeadObject(bucket_, K("job/step 1/1.ckpt")).status();
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
  EXPECT_THAT(missing.message(),
              HasSubstr("s3://" + bucket_ + "/" + K("job/step 1/1.ckpt")));
}

TEST_F(S3ClientTest, ListingsFollowEveryPage) {
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(
        client_->PutObject(bucket_, K(absl::StrCat("p/", i)), Bytes(10)).ok());
  }
  absl::StatusOr<std::vector<ObjectInfo>> listed =
      client_->ListObjects(bucket_, K("p/"), /*page_size=*/3);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 7u);
  for (int i = 0; i < 7; ++i)
    EXPECT_EQ((*listed)[i].key, K(absl::StrCat("p/", i)));
}

TEST_F(S3ClientTest, RangesLandInPlaceAndARangePastTheEndIsNamed) {
  const std::vector<uint8_t> data = Bytes((3 << 20) + 17);
  ASSERT_TRUE(client_->PutObject(bucket_, K("r"), data).ok());
  for (auto [offset, length] :
       std::vector<std::pair<size_t, size_t>>{{0, 1},
                                              {1, 4096},
                                              {(1 << 20) - 5, 10},
                                              {data.size() - 17, 17},
                                              {0, data.size()}}) {
    std::vector<uint8_t> out(length + 2, 0xAB);
    absl::Status got = client_->GetRange(
        bucket_, K("r"), offset, absl::MakeSpan(out.data() + 1, length));
    ASSERT_TRUE(got.ok()) << got << " at " << offset << "+" << length;
    EXPECT_TRUE(
        std::equal(out.begin() + 1, out.end() - 1, data.begin() + offset))
        << offset << "+" << length;
    EXPECT_EQ(out.front(), 0xAB);
    EXPECT_EQ(out.back(), 0xAB) << "nothing written past the span";
  }
  std::vector<uint8_t> past(10);
  absl::Status beyond =
      client_->GetRange(bucket_, K("r"), data.size() + 5, absl::MakeSpan(past));
  EXPECT_TRUE(absl::IsOutOfRange(beyond)) << beyond;
  absl::Status straddling =
      client_->GetRange(bucket_, K("r"), data.size() - 5, absl::MakeSpan(past));
  EXPECT_TRUE(absl::IsOutOfRange(straddling)) << straddling;
  EXPECT_THAT(straddling.message(), HasSubstr("an object of"));
  absl::Status missing =
      client_->GetRange(bucket_, K("nothing"), 0, absl::MakeSpan(past));
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("HTTP 404"));
}

TEST_F(S3ClientTest, MultipartUploadsAssembleBitExactAndAbortedOnesGo) {
  constexpr size_t kPart = 5 << 20;  // S3's smallest part but the last
  const std::vector<uint8_t> data = Bytes(2 * kPart + 12345);
  absl::StatusOr<std::string> id =
      client_->CreateMultipartUpload(bucket_, K("job/big.ckpt"));
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::vector<MultipartUpload>> open =
      client_->ListMultipartUploads(bucket_, K("job/"));
  ASSERT_TRUE(open.ok()) << open.status();
  ASSERT_EQ(open->size(), 1u);
  EXPECT_EQ((*open)[0].upload_id, *id);
  EXPECT_EQ((*open)[0].key, K("job/big.ckpt"));
  std::vector<UploadedPart> etags;
  for (size_t at = 0, n = 1; at < data.size(); at += kPart, ++n) {
    absl::StatusOr<UploadedPart> etag = client_->UploadPart(
        bucket_, K("job/big.ckpt"), *id, static_cast<int>(n),
        absl::MakeConstSpan(data).subspan(at, kPart));
    ASSERT_TRUE(etag.ok()) << etag.status();
    etags.push_back(*etag);
  }
  absl::Status done =
      client_->CompleteMultipartUpload(bucket_, K("job/big.ckpt"), *id, etags);
  ASSERT_TRUE(done.ok()) << done;
  absl::StatusOr<std::string> got =
      client_->GetObject(bucket_, K("job/big.ckpt"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == AsString(data));
  open = client_->ListMultipartUploads(bucket_, K("job/"));
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->empty());

  // An upload begun and abandoned (a daemon that crashed) is found and
  // aborted; the object never appears.
  absl::StatusOr<std::string> left =
      client_->CreateMultipartUpload(bucket_, K("job/left.ckpt"));
  ASSERT_TRUE(left.ok());
  ASSERT_TRUE(client_
                  ->UploadPart(bucket_, K("job/left.ckpt"), *left, 1,
                               absl::MakeConstSpan(data).subspan(0, kPart))
                  .ok());
  open = client_->ListMultipartUploads(bucket_, K("job/"));
  ASSERT_TRUE(open.ok());
  ASSERT_EQ(open->size(), 1u);
  EXPECT_GT((*open)[0].initiated, absl::Now() - absl::Hours(1));
  ASSERT_TRUE(
      client_->AbortMultipartUpload(bucket_, K("job/left.ckpt"), *left).ok());
  open = client_->ListMultipartUploads(bucket_, K("job/"));
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->empty());
  EXPECT_TRUE(absl::IsNotFound(
      client_->HeadObject(bucket_, K("job/left.ckpt")).status()));
}

TEST_F(S3ClientTest, WrongCredentialsAreNamedAndNotRetried) {
  S3Options wrong = Options();
  wrong.credentials.secret_access_key = "not-the-secret";
  wrong.first_backoff = absl::Seconds(10);  // a retry would show
  absl::StatusOr<std::unique_ptr<S3Client>> c = S3Client::Create(wrong);
  ASSERT_TRUE(c.ok());
  const absl::Time start = absl::Now();
  absl::Status put = (*c)->PutObject(bucket_, K("job/x"), Bytes(100));
  EXPECT_TRUE(absl::IsPermissionDenied(put)) << put;
  EXPECT_THAT(put.message(),
              HasSubstr("PutObject s3://" + bucket_ + "/" + K("job/x")));
  EXPECT_THAT(put.message(), HasSubstr("HTTP 403"));
  EXPECT_THAT(put.message(), Not(HasSubstr("attempts")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  wrong.credentials.access_key_id = "nobody";
  c = S3Client::Create(wrong);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(
      absl::IsPermissionDenied((*c)->GetObject(bucket_, K("job/x")).status()));
}

// Through a proxy that answers with faults: 503s, 500s, resets and bodies
// damaged on the way (refused by the server's checksum) are tried again until
// the request goes through; faults that outlast the attempts give the last
// error, naming the key and the status.
TEST_F(S3ClientTest, FaultsAreTriedAgainAndTheLastOneNamed) {
  tools::FaultProxy proxy(std::stoi(
      TestServer().endpoint().substr(TestServer().endpoint().rfind(':') + 1)));
  ASSERT_TRUE(proxy.Start());
  S3Options o = Options();
  o.endpoint = proxy.endpoint();
  o.first_backoff = absl::Milliseconds(1);
  o.max_attempts = 4;
  absl::StatusOr<std::unique_ptr<S3Client>> c = S3Client::Create(o);
  ASSERT_TRUE(c.ok());
  const std::vector<uint8_t> data = Bytes((1 << 20) + 5);
  using Fault = tools::FaultProxy::Fault;
  proxy.Arm(Fault::kStatus503, 1);
  proxy.Arm(Fault::kReset, 1);
  proxy.Arm(Fault::kStatus500, 1);
  absl::Status put = (*c)->PutObject(bucket_, K("faulty"), data);
  ASSERT_TRUE(put.ok()) << put;
  EXPECT_EQ(proxy.injected(), 3);
  proxy.Arm(Fault::kReset, 1);
  proxy.Arm(Fault::kStatus503, 1);
  std::vector<uint8_t> back(data.size());
  absl::Status got =
      (*c)->GetRange(bucket_, K("faulty"), 0, absl::MakeSpan(back));
  ASSERT_TRUE(got.ok()) << got;
  EXPECT_TRUE(back == data);
  EXPECT_EQ(proxy.injected(), 5);
  // A byte damaged on the way: the server checks the part's CRC32C, refuses
  // it (BadDigest), and it is sent again.
  proxy.Arm(Fault::kCorrupt, 1);
  put = (*c)->PutObject(bucket_, K("faulty"), data);
  ASSERT_TRUE(put.ok()) << put;
  EXPECT_EQ(proxy.injected(), 6);
  ASSERT_TRUE(
      (*c)->GetRange(bucket_, K("faulty"), 0, absl::MakeSpan(back)).ok());
  EXPECT_TRUE(back == data);
  proxy.Arm(Fault::kStatus503, 4);
  absl::Status gave_up = (*c)->HeadObject(bucket_, K("faulty")).status();
  EXPECT_TRUE(absl::IsUnavailable(gave_up)) << gave_up;
  EXPECT_THAT(gave_up.message(), HasSubstr(K("faulty")));
  EXPECT_THAT(gave_up.message(), HasSubstr("HTTP 503"));
  EXPECT_THAT(gave_up.message(), HasSubstr("after 4 attempts"));
}

TEST(S3ClientErrorsTest, AServerThatDoesNotAnswerIsTriedAgainThenNamed) {
  S3Options o;
  o.endpoint = absl::StrCat("http://127.0.0.1:", tools::FreeLoopbackPort());
  o.credentials = {"a", "b"};
  o.max_attempts = 3;
  o.first_backoff = absl::Milliseconds(1);
  absl::StatusOr<std::unique_ptr<S3Client>> c = S3Client::Create(o);
  ASSERT_TRUE(c.ok());
  absl::Status got = (*c)->GetObject("bucket", "key").status();
  EXPECT_TRUE(absl::IsUnavailable(got)) << got;
  EXPECT_THAT(got.message(), HasSubstr("GetObject s3://bucket/key"));
  EXPECT_THAT(got.message(), HasSubstr("after 3 attempts"));
}

TEST(S3ClientErrorsTest, BadEndpointsAndUrisAreNamed) {
  for (const char* endpoint :
       {"127.0.0.1:9000", "ftp://x", "http://", "http://a/b"}) {
    S3Options o;
    o.endpoint = endpoint;
    absl::Status s = S3Client::Create(o).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << endpoint;
    EXPECT_THAT(s.message(), HasSubstr(endpoint));
  }
  absl::StatusOr<S3Uri> uri = ParseS3Uri("s3://my-bucket/jobs/llama/");
  ASSERT_TRUE(uri.ok());
  EXPECT_EQ(uri->bucket, "my-bucket");
  EXPECT_EQ(uri->prefix, "jobs/llama");
  EXPECT_EQ(uri->ToString(), "s3://my-bucket/jobs/llama");
  EXPECT_TRUE(ParseS3Uri("s3://b2").ok() == false) << "too short";
  EXPECT_FALSE(ParseS3Uri("s3://My_Bucket/x").ok());
  EXPECT_FALSE(ParseS3Uri("/local/dir").ok());
  EXPECT_EQ(ParseS3Uri("s3://abc").value().prefix, "");
}

}  // namespace
}  // namespace ckpt::io::s3
