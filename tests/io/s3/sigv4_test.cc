// Signature Version 4 against the examples AWS publishes: the S3 API
// reference's signing examples (GET Object with a range, PUT Object, GET
// Bucket lifecycle, GET Bucket list objects; the documentation's example
// keys, 2013-05-24) and the generic SigV4 test suite's get-vanilla cases.
#include "io/s3/sigv4.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/s3/crc32c.h"

namespace ckpt::io::s3 {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;

// The S3 reference's example secret (the generic suite's differs: '+').
const Credentials kS3Example = {"AKIAIOSFODNN7EXAMPLE",
                                "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"};
constexpr absl::string_view kS3Date = "20130524T000000Z";
constexpr absl::string_view kEmpty =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

HttpRequest S3Get(const std::string& path,
                  std::vector<std::pair<std::string, std::string>> query) {
  HttpRequest r{"GET", "examplebucket.s3.amazonaws.com", path,
                std::move(query)};
  r.headers = {{"x-amz-date", std::string(kS3Date)},
               {"x-amz-content-sha256", std::string(kEmpty)}};
  return r;
}

TEST(SigV4Test, TheEmptyPayloadHashesAsPublished) {
  EXPECT_EQ(Sha256Hex(""), kEmpty);
  EXPECT_EQ(Sha256Hex("Welcome to Amazon S3."),
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
}

TEST(SigV4Test, GetObjectWithARange) {
  HttpRequest r = S3Get("/test.txt", {});
  r.headers.emplace_back("Range", "bytes=0-9");
  std::string signed_headers;
  EXPECT_EQ(CanonicalRequest(r, kEmpty, &signed_headers),
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\n"
            "range:bytes=0-9\nx-amz-content-sha256:" +
                std::string(kEmpty) +
                "\nx-amz-date:20130524T000000Z\n\n"
                "host;range;x-amz-content-sha256;x-amz-date\n" +
                std::string(kEmpty));
  EXPECT_EQ(
      Authorization(kS3Example, r, kEmpty, kS3Date, "us-east-1", "s3"),
      "AWS4-HMAC-SHA256 "
      "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
      "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
      "Signature="
      "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4Test, PutObjectSignsItsPayloadAndEncodesTheKey) {
  const std::string payload = Sha256Hex("Welcome to Amazon S3.");
  HttpRequest r{"PUT", "examplebucket.s3.amazonaws.com",
                "/" + UriEncode("test$file.text", false)};
  r.headers = {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
               {"x-amz-date", std::string(kS3Date)},
               {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
               {"x-amz-content-sha256", payload}};
  EXPECT_EQ(r.path, "/test%24file.text");
  EXPECT_THAT(
      Authorization(kS3Example, r, payload, kS3Date, "us-east-1", "s3"),
      EndsWith("SignedHeaders=date;host;x-amz-content-sha256;x-amz-date;"
               "x-amz-storage-class,Signature="
               "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108"
               "bd"));
}

TEST(SigV4Test, GetBucketLifecycleSignsAParameterWithoutValue) {
  const HttpRequest r = S3Get("/", {{"lifecycle", ""}});
  EXPECT_THAT(
      Authorization(kS3Example, r, kEmpty, kS3Date, "us-east-1", "s3"),
      EndsWith(
          "Signature="
          "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"));
}

TEST(SigV4Test, ListObjectsSortsItsParameters) {
  const HttpRequest r = S3Get("/", {{"prefix", "J"}, {"max-keys", "2"}});
  std::string signed_headers;
  EXPECT_THAT(CanonicalRequest(r, kEmpty, &signed_headers),
              HasSubstr("\n/\nmax-keys=2&prefix=J\n"));
  EXPECT_THAT(
      Authorization(kS3Example, r, kEmpty, kS3Date, "us-east-1", "s3"),
      EndsWith(
          "Signature="
          "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"));
}

// The generic suite (service "service", example.amazonaws.com, 2015-08-30).
TEST(SigV4Test, TheGenericSuitesVanillaRequests) {
  const Credentials suite = {"AKIDEXAMPLE",
                             "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"};
  HttpRequest r{"GET", "example.amazonaws.com", "/"};
  r.headers = {{"X-Amz-Date", "20150830T123600Z"}};
  EXPECT_EQ(Authorization(suite, r, kEmpty, "20150830T123600Z", "us-east-1",
                          "service"),
            "AWS4-HMAC-SHA256 "
            "Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request,"
            "SignedHeaders=host;x-amz-date,"
            "Signature="
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
  r.query = {{"Param2", "value2"}, {"Param1", "value1"}};
  EXPECT_THAT(
      Authorization(suite, r, kEmpty, "20150830T123600Z", "us-east-1",
                    "service"),
      EndsWith(
          "Signature="
          "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"));
}

TEST(SigV4Test, SignS3AddsTheDatePayloadTokenAndAuthorization) {
  Credentials temporary = kS3Example;
  temporary.session_token = "token/with+chars=";
  HttpRequest r{"GET", "127.0.0.1:9000", "/bucket/key"};
  SignS3(temporary, "us-east-1", absl::FromUnixSeconds(1369353600), kEmpty, &r);
  ASSERT_EQ(r.headers.size(), 4u);
  EXPECT_EQ(r.headers[0].second, "20130524T000000Z");
  EXPECT_EQ(r.headers[1].second, kEmpty);
  EXPECT_EQ(r.headers[2].first, "x-amz-security-token");
  EXPECT_THAT(r.headers[3].second,
              HasSubstr("SignedHeaders=host;x-amz-content-sha256;x-amz-date;"
                        "x-amz-security-token,"));
}

// The checksum parts and objects carry: CRC32C's check value, as S3 writes
// it (base64 of the big-endian value).
TEST(SigV4Test, TheCrc32cChecksumIsCastagnolisAsS3WritesIt) {
  const std::string check = "123456789";
  const absl::Span<const uint8_t> bytes(
      reinterpret_cast<const uint8_t*>(check.data()), check.size());
  EXPECT_EQ(Crc32c(bytes), 0xE3069283u);
  EXPECT_EQ(Crc32cBase64(bytes), "4waSgw==");
  EXPECT_EQ(Crc32cBase64({}), "AAAAAA==");
}

TEST(SigV4Test, UriEncodingKeepsUnreservedAndOptionallySlashes) {
  EXPECT_EQ(UriEncode("a-b_c.d~e/f g+h*", false), "a-b_c.d~e/f%20g%2Bh%2A");
  EXPECT_EQ(UriEncode("a/b", true), "a%2Fb");
  EXPECT_EQ(UriEncode("\xc3\xa9", true), "%C3%A9");
}

}  // namespace
}  // namespace ckpt::io::s3
