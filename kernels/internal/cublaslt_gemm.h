#ifndef MUONSHARD_KERNELS_INTERNAL_CUBLASLT_GEMM_H_
#define MUONSHARD_KERNELS_INTERNAL_CUBLASLT_GEMM_H_

// Strided-batched GEMMs through cuBLASLt with cached plans.
//
// cuBLASLt rather than cublasGemmStridedBatchedEx because it takes separate
// C and D: the Newton–Schulz steps B = b·A + c·A·A and X' = a·X + B·X then
// need no copy of A or X into the output first (a copy costs ~30% of the GEMM
// at m = 1024). Descriptors and the heuristic's algorithm are built once per
// GemmSpec (shape, layout, batch, pointer alignment) and reused, so steady
// state calls only enqueue. Should the heuristic offer no algorithm for a
// spec, that spec falls back to cublasGemmStridedBatchedEx with C copied into
// D first. Nothing here synchronises with the device.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonshard::kernels::internal {

// Column-major D = alpha·op(A)·op(B) + beta·C, with op(A) m x k, op(B) k x n,
// C and D m x n sharing ldd; `batch` problems `stride_*` elements apart.
struct GemmSpec {
  bool bf16 = true;  // bf16 A/B/C/D, else fp32; compute is fp32 either way.
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  int32_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;

  auto Key() const {
    return std::make_tuple(bf16, trans_a, trans_b, m, n, k, lda, ldb, ldd, batch, stride_a, stride_b, stride_d);
  }
};

// RAII owner of a cuBLASLt handle, its workspace and the plan cache. Not
// thread-safe; bound to the device that was current at Create().
class CublasLtGemm {
 public:
  // `force_fallback` routes every GEMM through the cuBLAS fallback (tests).
  // Possible errors: RESOURCE_EXHAUSTED, UNAVAILABLE, INTERNAL.
  static absl::StatusOr<std::unique_ptr<CublasLtGemm>> Create(bool force_fallback = false);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Enqueues the GEMM on `stream`. `c` may equal `d`; when beta == 0 it is
  // not read. Possible errors: INTERNAL (no algorithm, launch failure).
  absl::Status Run(const GemmSpec& spec, float alpha, const void* a, const void* b, float beta, const void* c, void* d,
                   cudaStream_t stream);

 private:
  struct Plan;
  // Spec key + the alignments (bytes) of a, b, c and d.
  using PlanKey = decltype(std::tuple_cat(GemmSpec().Key(), std::make_tuple(0u, 0u, 0u, 0u)));

  CublasLtGemm(cublasLtHandle_t handle, cublasHandle_t fallback, void* workspace, size_t workspace_bytes,
               bool force_fallback);
  absl::StatusOr<const Plan*> GetPlan(const GemmSpec& spec, const PlanKey& key);
  absl::Status RunFallback(const GemmSpec& spec, float alpha, const void* a, const void* b, float beta, const void* c,
                           void* d, cudaStream_t stream);

  cublasLtHandle_t handle_;
  cublasHandle_t fallback_;
  void* workspace_;
  size_t workspace_bytes_;
  bool force_fallback_;
  absl::flat_hash_map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_CUBLASLT_GEMM_H_
