#ifndef MUONSHARD_COMMON_HALF_FLOAT_H_
#define MUONSHARD_COMMON_HALF_FLOAT_H_

// Host-side conversions between fp32 and the 16-bit float formats (bf16,
// IEEE fp16) for code that keeps 16-bit values in uint16_t words (the CPU
// communicators, the optimizer's buffers). Conversions to 16 bits round to
// nearest, ties to even; NaN stays a quiet NaN, infinities and signed zeros
// are kept, out-of-range values become infinity. (kernels/bf16.h has the
// device-capable bf16 conversion the kernels share; it rounds identically.)

#include <cstdint>

namespace muonshard {

float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

}  // namespace muonshard

#endif  // MUONSHARD_COMMON_HALF_FLOAT_H_
