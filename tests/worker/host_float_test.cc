// The CPU backends' 16-bit conversions, checked exhaustively: every bf16 and
// fp16 value round-trips, and every midpoint between neighbours rounds to
// the even one (and one fp32 ulp either side rounds to the nearer one).

#include "worker/comm/internal/host_float.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace muonshard::worker::internal {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

using ToFloat = float (*)(uint16_t);
using FromFloat = uint16_t (*)(float);

// Positive finite patterns h whose successor h + 1 is also finite.
void CheckRoundTripAndTies(ToFloat to_float, FromFloat from_float, uint16_t first_non_finite) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float f = to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_float(from_float(f)))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(from_float(f), h) << std::hex << bits;
  }
  for (uint32_t bits = 0; bits + 1 < first_non_finite; ++bits) {
    const auto lo = static_cast<uint16_t>(bits);
    const auto hi = static_cast<uint16_t>(bits + 1);
    // Exact in fp32 (the gap is a power of two), and no overflow near the
    // largest values as (lo + hi) / 2 would have.
    const float mid = to_float(lo) + (to_float(hi) - to_float(lo)) / 2;
    ASSERT_EQ(from_float(mid), (lo % 2 == 0) ? lo : hi) << std::hex << bits;
    ASSERT_EQ(from_float(std::nextafter(mid, 0.0f)), lo) << std::hex << bits;
    ASSERT_EQ(from_float(std::nextafter(mid, kInfinity)), hi) << std::hex << bits;
    // The sign bit is independent of rounding.
    ASSERT_EQ(from_float(-mid), (from_float(mid) | 0x8000)) << std::hex << bits;
  }
}

TEST(HostFloatTest, BFloat16_EveryValue_RoundTripsAndTiesToEven) {
  CheckRoundTripAndTies(&BFloat16ToFloat, &FloatToBFloat16, 0x7f80);
}

TEST(HostFloatTest, Half_EveryValue_RoundTripsAndTiesToEven) {
  CheckRoundTripAndTies(&HalfToFloat, &FloatToHalf, 0x7c00);
}

TEST(HostFloatTest, Half_OutOfRange_SaturatesToInfinityOrZero) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // tie rounds up to even: inf
  EXPECT_EQ(FloatToHalf(1e9f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e9f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: 0
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
}

TEST(HostFloatTest, BFloat16_Extremes_RoundCorrectly) {
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(HostFloatTest, WidenAndNarrow_Float32_CopiesBits) {
  const float in[3] = {1.5f, -0.0f, 3e38f};
  float wide[3];
  WidenToFloat(in, 3, CommDType::kFloat32, wide);
  float back[3];
  NarrowFromFloat(wide, 3, CommDType::kFloat32, back);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::signbit(back[i]), std::signbit(in[i]));
    EXPECT_EQ(back[i], in[i]);
  }
}

}  // namespace
}  // namespace muonshard::worker::internal
