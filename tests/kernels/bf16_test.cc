#include "kernels/bf16.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/fixture_reader.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::kernels {
namespace {

using ::muonshard::kernels::testing::FixtureCase;
using ::muonshard::kernels::testing::ReadFixtureFile;

TEST(Bf16Test, MatchesNumpyRoundToNearestEven) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<FixtureCase> cases, ReadFixtureFile("bf16.txt"));
  ASSERT_EQ(cases.size(), 1u);
  const std::vector<double> in = cases[0].Doubles("input_bits");
  const std::vector<double> expected = cases[0].Doubles("expected_bits");
  ASSERT_EQ(in.size(), expected.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const float f = BitsToFloat(static_cast<uint32_t>(in[i]));
    EXPECT_EQ(FloatToBf16(f), static_cast<Bf16Bits>(expected[i]))
        << "input bits 0x" << std::hex << static_cast<uint32_t>(in[i]);
  }
}

TEST(Bf16Test, EveryBf16ValueRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float f = Bf16ToFloat(static_cast<Bf16Bits>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(f))));
    } else {
      ASSERT_EQ(FloatToBf16(f), bits);
    }
  }
}

TEST(Bf16Test, TiesGoToEven) {
  // 1 + 2^-8 is half-way between 1 and 1 + 2^-7: the even neighbour is 1.
  EXPECT_EQ(FloatToBf16(1.0f + 0x1p-8f), FloatToBf16(1.0f));
  // 1 + 3·2^-8 is half-way between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // +inf
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::signaling_NaN()))));
}

TEST(Bf16Test, ArrayHelpersMatchScalarConversions) {
  const std::vector<float> in = {0.1f, -3.14159f, 65504.0f, 1e-20f, -0.0f};
  std::vector<Bf16Bits> bits(in.size());
  FloatToBf16(in.data(), bits.data(), static_cast<int64_t>(in.size()));
  std::vector<float> back(in.size());
  Bf16ToFloat(bits.data(), back.data(), static_cast<int64_t>(in.size()));
  std::vector<float> rounded = in;
  RoundToBf16InPlace(rounded.data(), static_cast<int64_t>(rounded.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(bits[i], FloatToBf16(in[i]));
    EXPECT_EQ(back[i], RoundToBf16(in[i]));
    EXPECT_EQ(rounded[i], back[i]);
  }
  EXPECT_TRUE(std::signbit(back[4]));
}

}  // namespace
}  // namespace muonshard::kernels
