#include "common/half_float.h"

#include <cmath>
#include <cstring>

namespace muonshard {
namespace {

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Shifts `mantissa` right by `shift` (1..31) rounding to nearest, ties to
// even; a carry out of the mantissa correctly bumps the exponent field of the
// caller's encoding.
uint32_t ShiftRoundEven(uint32_t mantissa, int shift) {
  const uint32_t result = mantissa >> shift;
  const uint32_t remainder = mantissa & ((uint32_t{1} << shift) - 1);
  const uint32_t half = uint32_t{1} << (shift - 1);
  const bool round_up = remainder > half || (remainder == half && (result & 1));
  return result + (round_up ? 1 : 0);
}

}  // namespace

float BFloat16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = FloatBits(value);
  if (std::isnan(value)) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040);  // keep it quiet
  }
  // Infinity and the largest finite values round correctly too: a carry
  // into the exponent of 0x7f7f.. gives 0x7f80 (infinity).
  return static_cast<uint16_t>(ShiftRoundEven(bits, 16));
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {
    return BitsFloat(sign | 0x7f800000 | (mantissa << 13));
  }
  return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffff;
  if (magnitude > 0x7f800000) return sign | 0x7e00;  // NaN
  // 65520 (0x477ff000) is the midpoint between 65504 (max half) and 2^16; it
  // and everything above round to infinity.
  if (magnitude >= 0x477ff000) return sign | 0x7c00;
  if (magnitude < 0x38800000) {
    // Below 2^-14: a half subnormal, mantissa = round(|value| * 2^24).
    // Anything at or below 2^-25 (0x33000000) rounds to zero (ties to even).
    if (magnitude <= 0x33000000) return sign;
    const int exponent = static_cast<int>(magnitude >> 23);
    const uint32_t mantissa = (magnitude & 0x7fffff) | 0x800000;
    return sign | static_cast<uint16_t>(ShiftRoundEven(mantissa, 126 - exponent));
  }
  // Normal: rebias the exponent (127 -> 15) and round the mantissa 23 -> 10.
  const uint32_t rebased = magnitude - (uint32_t{112} << 23);
  return sign | static_cast<uint16_t>(ShiftRoundEven(rebased, 13));
}

}  // namespace muonshard
