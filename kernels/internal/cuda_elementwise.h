#ifndef MUONSHARD_KERNELS_INTERNAL_CUDA_ELEMENTWISE_H_
#define MUONSHARD_KERNELS_INTERNAL_CUDA_ELEMENTWISE_H_

// Launchers for the fused elementwise CUDA kernels (cuda_elementwise.cu).
// Each enqueues on `stream` and returns the launch error (cudaGetLastError),
// never waiting for the device.
//
// "Batched" buffers hold `batch` matrices of `per_matrix` elements; the
// Newton–Schulz work buffers pad each matrix to `stride` elements (so every
// matrix starts 256-byte aligned for cuBLASLt), the caller's tensors do not.
// Pointers are device memory.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/bf16.h"
#include "kernels/internal/elementwise_math.h"

namespace muonshard::kernels::internal {

// sums[b] += Σ x[b]², in double. REQUIRES: sums zeroed for a fresh sum.
cudaError_t LaunchSumSquares(const float* x, int64_t batch, int64_t per_matrix, double* sums, cudaStream_t stream);

// Muon momentum (MomentumElement) for every element; writes the update input
// to `update` and adds its squares to sums[b] (unless `sums` is null).
cudaError_t LaunchMomentum(const float* grad, float* momentum, float* update, int64_t batch, int64_t per_matrix,
                           float beta, bool nesterov, double* sums, cudaStream_t stream);

// x[b·stride + i] = T(in[b·per_matrix + i] / max(sqrt(sums[b]), eps)), with
// T = bf16 (round to nearest even) or float.
cudaError_t LaunchNormalize(const float* in, int64_t batch, int64_t per_matrix, const double* sums, float eps,
                            int64_t stride, Bf16Bits* x, cudaStream_t stream);
cudaError_t LaunchNormalize(const float* in, int64_t batch, int64_t per_matrix, const double* sums, float eps,
                            int64_t stride, float* x, cudaStream_t stream);

// For each of `batch` m x m column-major matrices `stride` apart: copies the
// upper triangle (row < col) onto the lower one.
cudaError_t LaunchMirrorUpperToLower(Bf16Bits* a, int64_t m, int64_t batch, int64_t stride, cudaStream_t stream);
cudaError_t LaunchMirrorUpperToLower(float* a, int64_t m, int64_t batch, int64_t stride, cudaStream_t stream);

// out[b·per_matrix + i] = float(x[b·stride + i]).
cudaError_t LaunchWiden(const Bf16Bits* x, int64_t batch, int64_t per_matrix, int64_t stride, float* out,
                        cudaStream_t stream);

// Muon apply (MuonApplyElement): master = master·decay - step·O, and the
// optional bf16 model copy; O is read at b·stride + i.
cudaError_t LaunchMuonApply(const Bf16Bits* ortho, int64_t batch, int64_t per_matrix, int64_t stride, float decay,
                            float step, float* master, Bf16Bits* model, cudaStream_t stream);
cudaError_t LaunchMuonApply(const float* ortho, int64_t batch, int64_t per_matrix, int64_t stride, float decay,
                            float step, float* master, Bf16Bits* model, cudaStream_t stream);

// AdamW (AdamWElement) over n elements; `model` may be null.
cudaError_t LaunchAdamW(const float* grad, float* master, float* moment1, float* moment2, Bf16Bits* model, int64_t n,
                        const AdamWScalars& scalars, cudaStream_t stream);

// out[i] = bf16(in[i]).
cudaError_t LaunchCastToBf16(const float* in, Bf16Bits* out, int64_t n, cudaStream_t stream);

// out[i] = float(in[i]) (round to nearest) and out[i] = double(in[i]) (exact),
// for small per-matrix scalars such as the squared norms.
cudaError_t LaunchDoubleToFloat(const double* in, float* out, int64_t n, cudaStream_t stream);
cudaError_t LaunchFloatToDouble(const float* in, double* out, int64_t n, cudaStream_t stream);

// out[i] = out_type(float(in[i])) for i < n; types are ElementType values
// (0 fp32, 1 bf16, 2 fp16), rounding to nearest even.
cudaError_t LaunchConvert(const void* in, int in_type, void* out, int out_type, int64_t n, cudaStream_t stream);

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_CUDA_ELEMENTWISE_H_
