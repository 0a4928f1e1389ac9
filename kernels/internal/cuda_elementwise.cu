// Fused elementwise CUDA kernels of the optimizer step: Frobenius sums,
// momentum, normalise-and-cast, triangle mirroring, the Muon and AdamW
// updates, bf16 casts and float/double casts of per-matrix scalars. All are
// memory-bound grid-stride loops; batched kernels put the matrix index on
// gridDim.y (or z) so each block works inside one matrix and per-matrix
// scalars are loaded once.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/bf16.h"
#include "kernels/internal/cuda_elementwise.h"
#include "kernels/internal/elementwise_math.h"

namespace muonshard::kernels::internal {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;
// Enough blocks to fill an H100/H200 (132 SMs x 8 resident blocks) several
// times; grid-stride loops cover the rest.
constexpr int64_t kTargetBlocks = 8192;
constexpr int kTile = 32;  // Mirror tile edge.
constexpr int kTileRows = 8;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid for `batch` matrices of `per_matrix` elements.
dim3 BatchedGrid(int64_t batch, int64_t per_matrix) {
  const int64_t y = std::min(batch, kMaxGridY);
  const int64_t x_cap = std::max<int64_t>(1, kTargetBlocks / y);
  const int64_t x = std::clamp<int64_t>(CeilDiv(per_matrix, kThreads * 4), 1, x_cap);
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
}

dim3 FlatGrid(int64_t n) {
  return dim3(static_cast<unsigned>(std::clamp<int64_t>(CeilDiv(n, kThreads), 1, kTargetBlocks)));
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t GridThreads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Sum of `v` over the block, valid in thread 0. Ends with a barrier so the
// shared scratch can be reused by the next call.
__device__ double BlockSum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) {
      v += __shfl_down_sync(0xffffffffu, v, offset);
    }
  }
  __syncthreads();
  return v;
}

__global__ void SumSquaresKernel(const float* x, int64_t batch, int64_t per_matrix, double* sums) {
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    const float* m = x + b * per_matrix;
    double sum = 0;
    for (int64_t i = GlobalThread(); i < per_matrix; i += GridThreads()) {
      sum += static_cast<double>(m[i]) * m[i];
    }
    sum = BlockSum(sum);
    if (threadIdx.x == 0 && sums != nullptr) atomicAdd(&sums[b], sum);
  }
}

__global__ void MomentumKernel(const float* grad, float* momentum, float* update, int64_t batch, int64_t per_matrix,
                               float beta, bool nesterov, double* sums) {
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    const int64_t base = b * per_matrix;
    double sum = 0;
    for (int64_t i = GlobalThread(); i < per_matrix; i += GridThreads()) {
      float m = momentum[base + i];
      const float u = MomentumElement(grad[base + i], m, beta, nesterov);
      momentum[base + i] = m;
      update[base + i] = u;
      sum += static_cast<double>(u) * u;
    }
    sum = BlockSum(sum);
    if (threadIdx.x == 0) atomicAdd(&sums[b], sum);
  }
}

__device__ __forceinline__ void Store(float v, float* out) { *out = v; }
__device__ __forceinline__ void Store(float v, Bf16Bits* out) { *out = FloatToBf16(v); }
__device__ __forceinline__ float Load(const float* in) { return *in; }
__device__ __forceinline__ float Load(const Bf16Bits* in) { return Bf16ToFloat(*in); }

template <typename T>
__global__ void NormalizeKernel(const float* in, int64_t batch, int64_t per_matrix, const double* sums, float eps,
                                int64_t stride, T* x) {
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    // Same expression as the CPU: multiply by the fp32 reciprocal.
    const float scale = static_cast<float>(1.0 / fmax(sqrt(sums[b]), static_cast<double>(eps)));
    const float* src = in + b * per_matrix;
    T* dst = x + b * stride;
    for (int64_t i = GlobalThread(); i < per_matrix; i += GridThreads()) {
      Store(src[i] * scale, &dst[i]);
    }
  }
}

// One block per 32 x 32 tile of the strictly-lower part: reads the mirrored
// upper tile with coalesced loads into shared memory, writes it transposed.
template <typename T>
__global__ void MirrorKernel(T* a, int64_t m, int64_t batch, int64_t stride) {
  const int64_t tile_row = blockIdx.y;  // Destination rows.
  const int64_t tile_col = blockIdx.x;  // Destination columns.
  if (tile_row < tile_col) return;
  __shared__ T tile[kTile][kTile + 1];
  const int64_t row0 = tile_row * kTile;
  const int64_t col0 = tile_col * kTile;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    T* mat = a + b * stride;
    // tile[j][i] = a(col0 + i, row0 + j): source element (row col0+i,
    // column row0+j) of the column-major matrix, contiguous in i.
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t src_row = col0 + threadIdx.x;
      const int64_t src_col = row0 + j;
      if (src_row < m && src_col < m) {
        tile[j][threadIdx.x] = mat[src_row + src_col * m];
      }
    }
    __syncthreads();
    // a(row0 + i, col0 + j) = a(col0 + j, row0 + i) = tile[i][j].
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t dst_row = row0 + threadIdx.x;
      const int64_t dst_col = col0 + j;
      if (dst_row < m && dst_col < m && dst_row > dst_col) {
        mat[dst_row + dst_col * m] = tile[threadIdx.x][j];
      }
    }
    __syncthreads();
  }
}

__global__ void WidenKernel(const Bf16Bits* x, int64_t batch, int64_t per_matrix, int64_t stride, float* out) {
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    for (int64_t i = GlobalThread(); i < per_matrix; i += GridThreads()) {
      out[b * per_matrix + i] = Bf16ToFloat(x[b * stride + i]);
    }
  }
}

template <typename T>
__global__ void MuonApplyKernel(const T* ortho, int64_t batch, int64_t per_matrix, int64_t stride, float decay,
                                float step, float* master, Bf16Bits* model) {
  for (int64_t b = blockIdx.y; b < batch; b += gridDim.y) {
    for (int64_t i = GlobalThread(); i < per_matrix; i += GridThreads()) {
      const int64_t k = b * per_matrix + i;
      const float p = MuonApplyElement(master[k], Load(&ortho[b * stride + i]), decay, step);
      master[k] = p;
      if (model != nullptr) model[k] = FloatToBf16(p);
    }
  }
}

__global__ void AdamWKernel(const float* grad, float* master, float* moment1, float* moment2, Bf16Bits* model,
                            int64_t n, AdamWScalars scalars) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    float p = master[i];
    float m1 = moment1[i];
    float m2 = moment2[i];
    AdamWElement(grad[i], p, m1, m2, scalars);
    master[i] = p;
    moment1[i] = m1;
    moment2[i] = m2;
    if (model != nullptr) model[i] = FloatToBf16(p);
  }
}

__global__ void CastToBf16Kernel(const float* in, Bf16Bits* out, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    out[i] = FloatToBf16(in[i]);
  }
}

template <typename From, typename To>
__global__ void CastKernel(const From* in, To* out, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    out[i] = static_cast<To>(in[i]);
  }
}

// Element types as in kernels::ElementType.
constexpr int kConvertFloat32 = 0;
constexpr int kConvertBFloat16 = 1;

__device__ __forceinline__ float LoadAsFloat(const void* p, int type, int64_t i) {
  if (type == kConvertFloat32) return static_cast<const float*>(p)[i];
  if (type == kConvertBFloat16) {
    return Bf16ToFloat(static_cast<const Bf16Bits*>(p)[i]);
  }
  return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ void StoreFromFloat(void* p, int type, int64_t i, float v) {
  if (type == kConvertFloat32) {
    static_cast<float*>(p)[i] = v;
  } else if (type == kConvertBFloat16) {
    static_cast<Bf16Bits*>(p)[i] = FloatToBf16(v);
  } else {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
}

// The type branches are uniform across the grid, so they cost nothing next
// to the memory traffic.
__global__ void ConvertKernel(const void* in, int in_type, void* out, int out_type, int64_t n) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    StoreFromFloat(out, out_type, i, LoadAsFloat(in, in_type, i));
  }
}

template <typename T>
cudaError_t LaunchNormalizeT(const float* in, int64_t batch, int64_t per_matrix, const double* sums, float eps,
                             int64_t stride, T* x, cudaStream_t stream) {
  NormalizeKernel<T>
      <<<BatchedGrid(batch, per_matrix), kThreads, 0, stream>>>(in, batch, per_matrix, sums, eps, stride, x);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchMirrorT(T* a, int64_t m, int64_t batch, int64_t stride, cudaStream_t stream) {
  const unsigned tiles = static_cast<unsigned>(CeilDiv(m, kTile));
  const dim3 grid(tiles, tiles, static_cast<unsigned>(std::min(batch, kMaxGridY)));
  MirrorKernel<T><<<grid, dim3(kTile, kTileRows), 0, stream>>>(a, m, batch, stride);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchMuonApplyT(const T* ortho, int64_t batch, int64_t per_matrix, int64_t stride, float decay, float step,
                             float* master, Bf16Bits* model, cudaStream_t stream) {
  MuonApplyKernel<T><<<BatchedGrid(batch, per_matrix), kThreads, 0, stream>>>(ortho, batch, per_matrix, stride, decay,
                                                                              step, master, model);
  return cudaGetLastError();
}

template <typename From, typename To>
cudaError_t LaunchCastT(const From* in, To* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CastKernel<From, To><<<FlatGrid(n), kThreads, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSumSquares(const float* x, int64_t batch, int64_t per_matrix, double* sums, cudaStream_t stream) {
  SumSquaresKernel<<<BatchedGrid(batch, per_matrix), kThreads, 0, stream>>>(x, batch, per_matrix, sums);
  return cudaGetLastError();
}

cudaError_t LaunchMomentum(const float* grad, float* momentum, float* update, int64_t batch, int64_t per_matrix,
                           float beta, bool nesterov, double* sums, cudaStream_t stream) {
  MomentumKernel<<<BatchedGrid(batch, per_matrix), kThreads, 0, stream>>>(grad, momentum, update, batch, per_matrix,
                                                                          beta, nesterov, sums);
  return cudaGetLastError();
}

cudaError_t LaunchNormalize(const float* in, int64_t batch, int64_t per_matrix, const double* sums, float eps,
                            int64_t stride, Bf16Bits* x, cudaStream_t stream) {
  return LaunchNormalizeT(in, batch, per_matrix, sums, eps, stride, x, stream);
}

cudaError_t LaunchNormalize(const float* in, int64_t batch, int64_t per_matrix, const double* sums, float eps,
                            int64_t stride, float* x, cudaStream_t stream) {
  return LaunchNormalizeT(in, batch, per_matrix, sums, eps, stride, x, stream);
}

cudaError_t LaunchMirrorUpperToLower(Bf16Bits* a, int64_t m, int64_t batch, int64_t stride, cudaStream_t stream) {
  return LaunchMirrorT(a, m, batch, stride, stream);
}

cudaError_t LaunchMirrorUpperToLower(float* a, int64_t m, int64_t batch, int64_t stride, cudaStream_t stream) {
  return LaunchMirrorT(a, m, batch, stride, stream);
}

cudaError_t LaunchWiden(const Bf16Bits* x, int64_t batch, int64_t per_matrix, int64_t stride, float* out,
                        cudaStream_t stream) {
  WidenKernel<<<BatchedGrid(batch, per_matrix), kThreads, 0, stream>>>(x, batch, per_matrix, stride, out);
  return cudaGetLastError();
}

cudaError_t LaunchMuonApply(const Bf16Bits* ortho, int64_t batch, int64_t per_matrix, int64_t stride, float decay,
                            float step, float* master, Bf16Bits* model, cudaStream_t stream) {
  return LaunchMuonApplyT(ortho, batch, per_matrix, stride, decay, step, master, model, stream);
}

cudaError_t LaunchMuonApply(const float* ortho, int64_t batch, int64_t per_matrix, int64_t stride, float decay,
                            float step, float* master, Bf16Bits* model, cudaStream_t stream) {
  return LaunchMuonApplyT(ortho, batch, per_matrix, stride, decay, step, master, model, stream);
}

cudaError_t LaunchAdamW(const float* grad, float* master, float* moment1, float* moment2, Bf16Bits* model, int64_t n,
                        const AdamWScalars& scalars, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AdamWKernel<<<FlatGrid(n), kThreads, 0, stream>>>(grad, master, moment1, moment2, model, n, scalars);
  return cudaGetLastError();
}

cudaError_t LaunchCastToBf16(const float* in, Bf16Bits* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CastToBf16Kernel<<<FlatGrid(n), kThreads, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchDoubleToFloat(const double* in, float* out, int64_t n, cudaStream_t stream) {
  return LaunchCastT(in, out, n, stream);
}

cudaError_t LaunchFloatToDouble(const float* in, double* out, int64_t n, cudaStream_t stream) {
  return LaunchCastT(in, out, n, stream);
}

cudaError_t LaunchConvert(const void* in, int in_type, void* out, int out_type, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ConvertKernel<<<FlatGrid(n), kThreads, 0, stream>>>(in, in_type, out, out_type, n);
  return cudaGetLastError();
}

}  // namespace muonshard::kernels::internal
