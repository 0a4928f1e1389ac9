#include "kernels/bf16.h"

namespace muonshard::kernels {

void FloatToBf16(const float* in, Bf16Bits* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}

void Bf16ToFloat(const Bf16Bits* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

void RoundToBf16InPlace(float* data, int64_t n) {
  for (int64_t i = 0; i < n; ++i) data[i] = RoundToBf16(data[i]);
}

}  // namespace muonshard::kernels
