#ifndef MUONSHARD_KERNELS_BF16_H_
#define MUONSHARD_KERNELS_BF16_H_

// bfloat16 <-> float conversion shared by the CPU and CUDA kernels.
//
// A bf16 value is carried as its raw 16 bits (`uint16_t`): the upper half of
// the IEEE-754 binary32 encoding. That is the storage layout of
// `__nv_bfloat16`, `paddle::bfloat16` and `torch.bfloat16`, so buffers can be
// handed between them without conversion. The scalar functions are inline
// code usable from host and device (CUDA builds mark them
// `__host__ __device__`), so both backends round bit-identically.
//
// Rounding is round-to-nearest-even. NaN stays NaN (quiet, sign kept);
// infinities and signed zeros are preserved; values that round past the
// largest finite bf16 become infinity, as IEEE rounding requires.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MUONSHARD_HOST_DEVICE __host__ __device__
#else
#define MUONSHARD_HOST_DEVICE
#endif

namespace muonshard::kernels {

// Raw bits of a bfloat16 value.
using Bf16Bits = uint16_t;

MUONSHARD_HOST_DEVICE inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

MUONSHARD_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// float -> bf16, round to nearest, ties to even.
MUONSHARD_HOST_DEVICE inline Bf16Bits FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncating could clear every mantissa bit and produce infinity.
    return static_cast<Bf16Bits>((u >> 16) | 0x0040u);
  }
  // Adding 0x7fff plus the lowest kept bit rounds half-way cases to even; a
  // carry out of the mantissa correctly bumps the exponent (up to infinity).
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<Bf16Bits>((u + rounding_bias) >> 16);
}

// bf16 -> float (exact).
MUONSHARD_HOST_DEVICE inline float Bf16ToFloat(Bf16Bits b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// Rounds a float to the nearest bf16-representable float.
MUONSHARD_HOST_DEVICE inline float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

// Host array conversions. REQUIRES: `in` and `out` hold `n` elements and do
// not overlap.
void FloatToBf16(const float* in, Bf16Bits* out, int64_t n);
void Bf16ToFloat(const Bf16Bits* in, float* out, int64_t n);

// Rounds `n` floats in place to bf16 precision (the values stay fp32).
void RoundToBf16InPlace(float* data, int64_t n);

}  // namespace muonshard::kernels

#endif  // MUONSHARD_KERNELS_BF16_H_
