// The optimizer's dtype buffers and its IEEE half conversion.

#include "worker/optimizer/internal/typed_buffer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/half_float.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::worker::internal {
namespace {

TEST(Fp16Test, RoundTrip_EveryHalfValueIsExact) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = HalfToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << bits;
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), h) << std::hex << bits;
  }
}

TEST(Fp16Test, FloatToFp16Bits_RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // half-way to 2^16 rounds to infinity
  EXPECT_EQ(FloatToHalf(-1e9f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);      // tie between 0 and 2^-24
  EXPECT_EQ(FloatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 units -> 2
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14) * (1 - std::ldexp(1.0f, -12))), 0x0400);  // up to min normal
}

TEST(TypedBufferTest, WriteRead_RoundsToTheDtype) {
  const float value = 1.0f + 1.0f / 1024 + 1.0f / 4096;
  const struct {
    v1::DType dtype;
    float expected;
    int64_t bytes;
  } cases[] = {
      {v1::FP32, value, 16},
      {v1::BF16, kernels::RoundToBf16(value), 8},
      {v1::FP16, 1.0f + 1.0f / 1024, 8},
  };
  for (const auto& c : cases) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(TypedBuffer b, TypedBuffer::Create(c.dtype, 4));
    EXPECT_EQ(b.bytes(), c.bytes);
    b.Write(1, {value, value});
    std::vector<float> out(4, -1.0f);
    b.Read(0, absl::MakeSpan(out));
    EXPECT_EQ(out, (std::vector<float>{0.0f, c.expected, c.expected, 0.0f})) << v1::DType_Name(c.dtype);
    EXPECT_EQ(b.Get(2), c.expected);
    EXPECT_EQ(RoundToDType(value, c.dtype), c.expected);
    b.Zero(1, 1);
    EXPECT_EQ(b.Get(1), 0.0f);
  }
}

TEST(TypedBufferTest, Create_UnknownDtype_IsInvalidArgument) {
  EXPECT_EQ(TypedBuffer::Create(v1::DTYPE_UNSPECIFIED, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TypedBuffer::Create(v1::FP32, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace muonshard::worker::internal
