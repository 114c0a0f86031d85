#include "snapshot/cast.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::snapshot {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// c10::BFloat16's rounding: nearest, ties to even; every NaN the quiet NaN.
TEST(CastTest, Float32ToBfloat16RoundsLikeTorch) {
  EXPECT_EQ(Bfloat16Of(Bits(1.0f)), 0x3F80);
  EXPECT_EQ(Bfloat16Of(Bits(-2.5f)), 0xC020);
  EXPECT_EQ(Bfloat16Of(0x3F808000), 0x3F80);  // a tie: down to even
  EXPECT_EQ(Bfloat16Of(0x3F818000), 0x3F82);  // a tie: up to even
  EXPECT_EQ(Bfloat16Of(0x3F808001), 0x3F81);  // above the tie: up
  EXPECT_EQ(Bfloat16Of(0x3F807FFF), 0x3F80);  // below it: down
  EXPECT_EQ(Bfloat16Of(0x7F7FFFFF), 0x7F80);  // the largest float: infinity
  EXPECT_EQ(Bfloat16Of(0x7F800000), 0x7F80);  // infinity stays
  EXPECT_EQ(Bfloat16Of(0xFF800000), 0xFF80);
  EXPECT_EQ(Bfloat16Of(0x80000000), 0x8000);  // -0
  EXPECT_EQ(Bfloat16Of(0x00000001), 0x0000);  // the smallest subnormal
  EXPECT_EQ(Bfloat16Of(0x7FC00001), 0x7FC0);  // NaNs: quiet, positive
  EXPECT_EQ(Bfloat16Of(0xFF800001), 0x7FC0);
  EXPECT_EQ(Bfloat16Of(0x7FFFFFFF), 0x7FC0);
}

TEST(CastTest, SpansAreCastElementByElementAndSizesChecked) {
  const std::vector<float> in = {1.0f, -2.5f, 3.14159f};
  std::vector<uint8_t> out(6);
  ASSERT_TRUE(
      CastFloat32ToBfloat16({reinterpret_cast<const uint8_t*>(in.data()), 12},
                            absl::MakeSpan(out))
          .ok());
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t half;
    std::memcpy(&half, out.data() + 2 * i, 2);
    EXPECT_EQ(half, Bfloat16Of(Bits(in[i])));
  }
  std::vector<uint8_t> wrong(5);
  absl::Status bad = CastFloat32ToBfloat16(
      {reinterpret_cast<const uint8_t*>(in.data()), 12}, absl::MakeSpan(wrong));
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
}

}  // namespace
}  // namespace ckpt::snapshot
