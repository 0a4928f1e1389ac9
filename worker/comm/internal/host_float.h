#ifndef MUONSHARD_WORKER_COMM_INTERNAL_HOST_FLOAT_H_
#define MUONSHARD_WORKER_COMM_INTERNAL_HOST_FLOAT_H_

// Host-side 16-bit float conversions and fp32 reduction helpers for the CPU
// communicators, which reduce every dtype in fp32 (see "Numerics" in
// communicator.h). Conversions to 16 bits round to nearest, ties to even;
// NaN stays NaN (quiet), infinities and signed zeros are kept, out-of-range
// values become infinity. Thread-compatible pure functions.

#include <cstdint>

#include "common/half_float.h"
#include "worker/comm/communicator.h"

namespace muonshard::worker::internal {

// Scalar conversions: common/half_float.h.
using ::muonshard::BFloat16ToFloat;
using ::muonshard::FloatToBFloat16;
using ::muonshard::FloatToHalf;
using ::muonshard::HalfToFloat;

// dst[i] = float(src[i]) for `count` elements of `dtype` (a known dtype).
void WidenToFloat(const void* src, int64_t count, CommDType dtype, float* dst);
// dst[i] = dtype(src[i]), rounding as above.
void NarrowFromFloat(const float* src, int64_t count, CommDType dtype, void* dst);

// acc[i] += x[i].
void AddFloats(float* acc, const float* x, int64_t count);
// values[i] /= divisor (a division, not a multiply by 1/divisor, so kAvg of
// equal inputs returns them exactly).
void DivideFloats(float* values, int64_t count, float divisor);

}  // namespace muonshard::worker::internal

#endif  // MUONSHARD_WORKER_COMM_INTERNAL_HOST_FLOAT_H_
