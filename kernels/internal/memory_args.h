#ifndef MUONSHARD_KERNELS_INTERNAL_MEMORY_ARGS_H_
#define MUONSHARD_KERNELS_INTERNAL_MEMORY_ARGS_H_

// The argument check every backend's copy/zero/convert/cast call shares.

#include <cstdint>

#include "absl/status/status.h"

namespace muonshard::kernels::internal {

// INVALID_ARGUMENT naming `what` unless n >= 0 and, for n > 0, both
// pointers are set (pass the same one twice for one-pointer calls).
absl::Status CheckMemoryArgs(const char* what, int64_t n, const void* a, const void* b);

// KernelBackend::Copy2D's arguments: INVALID_ARGUMENT for negative sizes,
// a pitch below row_bytes, or a null pointer when anything is copied.
absl::Status CheckCopy2DArgs(const void* src, int64_t src_pitch, const void* dst, int64_t dst_pitch, int64_t row_bytes,
                             int64_t rows);

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_MEMORY_ARGS_H_
