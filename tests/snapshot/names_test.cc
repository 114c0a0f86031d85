#include "snapshot/names.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::snapshot {
namespace {

using ::testing::HasSubstr;

TEST(NamesTest, JobIds) {
  EXPECT_TRUE(ValidateJobId("llama-70b_run.3").ok());
  EXPECT_THAT(ValidateJobId("").message(), HasSubstr("empty"));
  EXPECT_THAT(ValidateJobId("..").message(), HasSubstr("not allowed"));
  EXPECT_THAT(ValidateJobId("a/b").message(), HasSubstr("contains"));
  EXPECT_THAT(ValidateJobId(std::string("a\0b", 3)).message(),
              HasSubstr("\\x00"));
  EXPECT_THAT(ValidateJobId(std::string(129, 'a')).message(),
              HasSubstr("limit is 128"));
  EXPECT_TRUE(ValidateJobId(std::string(128, 'a')).ok());
}

TEST(NamesTest, ItemNames) {
  EXPECT_TRUE(ValidateItemName("model.layers.0.attn/q_proj.weight").ok());
  EXPECT_TRUE(ValidateItemName("optimizer/state/0/exp_avg").ok());
  EXPECT_THAT(ValidateItemName("").message(), HasSubstr("empty"));
  EXPECT_THAT(ValidateItemName("/abs").message(), HasSubstr("absolute"));
  EXPECT_THAT(ValidateItemName("a/../b").message(), HasSubstr("'..'"));
  EXPECT_THAT(ValidateItemName("a/./b").message(), HasSubstr("'.'"));
  EXPECT_THAT(ValidateItemName("a//b").message(), HasSubstr("empty component"));
  EXPECT_THAT(ValidateItemName(std::string("a\0b", 3)).message(),
              HasSubstr("control"));
  EXPECT_THAT(ValidateItemName("tab\there").message(), HasSubstr("control"));
  EXPECT_THAT(ValidateItemName(std::string(1025, 'x')).message(),
              HasSubstr("limit is 1024"));
  EXPECT_EQ(ValidateItemName("..").code(), absl::StatusCode::kInvalidArgument);
}

TEST(NamesTest, RelativePaths) {
  EXPECT_TRUE(ValidateRelativePath("job/step-1/rank-0.shard").ok());
  EXPECT_THAT(ValidateRelativePath("/etc/passwd").message(),
              HasSubstr("absolute"));
  EXPECT_THAT(ValidateRelativePath("job/../../etc").message(),
              HasSubstr("'..'"));
  EXPECT_THAT(ValidateRelativePath(std::string("a\0b", 3)).message(),
              HasSubstr("NUL"));
  EXPECT_THAT(ValidateRelativePath(std::string(5000, 'a')).message(),
              HasSubstr("limit"));
}

}  // namespace
}  // namespace ckpt::snapshot
