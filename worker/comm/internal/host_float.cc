#include "worker/comm/internal/host_float.h"

#include <cmath>
#include <cstring>

#include "common/half_float.h"

namespace muonshard::worker::internal {

void WidenToFloat(const void* src, int64_t count, CommDType dtype, float* dst) {
  if (count == 0) return;  // empty buffers may be null, even for memcpy
  if (dtype == CommDType::kFloat32) {
    std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  const auto* in = static_cast<const uint16_t*>(src);
  const bool bf16 = dtype == CommDType::kBFloat16;
  for (int64_t i = 0; i < count; ++i) {
    dst[i] = bf16 ? BFloat16ToFloat(in[i]) : HalfToFloat(in[i]);
  }
}

void NarrowFromFloat(const float* src, int64_t count, CommDType dtype, void* dst) {
  if (count == 0) return;
  if (dtype == CommDType::kFloat32) {
    std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  auto* out = static_cast<uint16_t*>(dst);
  const bool bf16 = dtype == CommDType::kBFloat16;
  for (int64_t i = 0; i < count; ++i) {
    out[i] = bf16 ? FloatToBFloat16(src[i]) : FloatToHalf(src[i]);
  }
}

void AddFloats(float* acc, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) acc[i] += x[i];
}

void DivideFloats(float* values, int64_t count, float divisor) {
  for (int64_t i = 0; i < count; ++i) values[i] /= divisor;
}

}  // namespace muonshard::worker::internal
