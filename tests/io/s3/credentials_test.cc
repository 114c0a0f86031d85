// Where S3 credentials come from: given ones first, then the environment,
// then the shared credentials file's profile; the error of none names every
// place looked at.
#include "io/s3/credentials.h"

#include <cstdlib>
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::io::s3 {
namespace {

using ::testing::HasSubstr;

class CredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v :
         {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
          "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"}) {
      ::unsetenv(v);
    }
    ::setenv("HOME", dir_.path().c_str(), 1);
    testing::WriteAll(dir_.File("credentials"),
                      "# a comment\n[default]\naws_access_key_id = AKDEF\n"
                      "aws_secret_access_key = secret-def\n\n[train] \n"
                      "aws_access_key_id=AKTRAIN\naws_secret_access_key=s\n"
                      "aws_session_token = tok\n[broken]\n"
                      "aws_access_key_id = only\n");
  }
  testing::TempDir dir_;
};

TEST_F(CredentialsTest, GivenThenEnvironmentThenTheFilesProfile) {
  CredentialSources sources;
  sources.credentials_file = dir_.File("credentials");
  absl::StatusOr<Credentials> c = ResolveCredentials(sources);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "AKDEF");
  EXPECT_EQ(c->secret_access_key, "secret-def");
  ::setenv("AWS_PROFILE", "train", 1);
  c = ResolveCredentials(sources);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "AKTRAIN");
  EXPECT_EQ(c->session_token, "tok");
  ::setenv("AWS_ACCESS_KEY_ID", "AKENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "secret-env", 1);
  c = ResolveCredentials(sources);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key_id, "AKENV");
  sources.given = {"AKGIVEN", "secret-given"};
  c = ResolveCredentials(sources);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key_id, "AKGIVEN");
}

TEST_F(CredentialsTest, TheErrorOfNoneNamesWhereItLooked) {
  CredentialSources sources;
  sources.credentials_file = dir_.File("missing");
  absl::Status none = ResolveCredentials(sources).status();
  EXPECT_TRUE(absl::IsNotFound(none)) << none;
  EXPECT_THAT(none.message(), HasSubstr("AWS_ACCESS_KEY_ID"));
  EXPECT_THAT(none.message(), HasSubstr(dir_.File("missing")));
  sources.credentials_file = dir_.File("credentials");
  sources.profile = "nope";
  none = ResolveCredentials(sources).status();
  EXPECT_THAT(none.message(), HasSubstr("no profile [nope]"));
  sources.profile = "broken";
  none = ResolveCredentials(sources).status();
  EXPECT_TRUE(absl::IsInvalidArgument(none)) << none;
  EXPECT_THAT(none.message(), HasSubstr("aws_secret_access_key"));
  sources = {};
  sources.given.access_key_id = "AK";
  EXPECT_TRUE(absl::IsInvalidArgument(ResolveCredentials(sources).status()));
  // ~/.aws/credentials when nothing names a file.
  std::filesystem::create_directories(dir_.File(".aws"));
  testing::WriteAll(dir_.File(".aws/credentials"), "");
  none = ResolveCredentials({}).status();
  EXPECT_THAT(none.message(), HasSubstr(dir_.File(".aws/credentials")));
}

}  // namespace
}  // namespace ckpt::io::s3
