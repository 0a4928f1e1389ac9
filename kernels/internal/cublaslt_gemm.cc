#include "kernels/internal/cublaslt_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cublas_status.h"
#include "kernels/cuda_status.h"

namespace muonshard::kernels::internal {
namespace {

// cuBLASLt's recommended workspace on Hopper.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// Largest power of two (<= 256) dividing the address; cuBLASLt's heuristic
// otherwise assumes 256-byte aligned operands.
uint32_t PointerAlignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

template <typename T>
cublasStatus_t SetLayout(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attribute, T value) {
  return cublasLtMatrixLayoutSetAttribute(layout, attribute, &value, sizeof(value));
}

}  // namespace

// Descriptors and algorithm of one GemmSpec; C and D share a layout.
struct CublasLtGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatrixLayout_t b = nullptr;
  cublasLtMatrixLayout_t cd = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool use_lt = true;  // False: no cuBLASLt algorithm, use RunFallback.

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (cd != nullptr) cublasLtMatrixLayoutDestroy(cd);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

namespace {

absl::Status CreateLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int32_t batch, int64_t stride,
                          cublasLtMatrixLayout_t* layout) {
  MUONSHARD_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(layout, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
      "cublasLtMatrixLayoutCreate");
  MUONSHARD_CUBLAS_RETURN_IF_ERROR(SetLayout(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, batch),
                                   "setting the batch count");
  MUONSHARD_CUBLAS_RETURN_IF_ERROR(SetLayout(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride),
                                   "setting the batch stride");
  return absl::OkStatus();
}

absl::Status CreateOp(bool trans_a, bool trans_b, cublasLtMatmulDesc_t* op) {
  MUONSHARD_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                   "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  MUONSHARD_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
                                   "setting TRANSA");
  MUONSHARD_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
                                   "setting TRANSB");
  return absl::OkStatus();
}

// RAII for the heuristic's preference object.
class Preference {
 public:
  Preference() = default;
  ~Preference() {
    if (pref_ != nullptr) cublasLtMatmulPreferenceDestroy(pref_);
  }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;

  absl::Status Init(uint64_t workspace_bytes, uint32_t align_a, uint32_t align_b, uint32_t align_c, uint32_t align_d) {
    MUONSHARD_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref_), "cublasLtMatmulPreferenceCreate");
    MUONSHARD_RETURN_IF_ERROR(Set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes));
    MUONSHARD_RETURN_IF_ERROR(Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a));
    MUONSHARD_RETURN_IF_ERROR(Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b));
    MUONSHARD_RETURN_IF_ERROR(Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c));
    return Set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
  }
  cublasLtMatmulPreference_t get() const { return pref_; }

 private:
  template <typename T>
  absl::Status Set(cublasLtMatmulPreferenceAttributes_t attribute, T value) {
    return CublasToStatus(cublasLtMatmulPreferenceSetAttribute(pref_, attribute, &value, sizeof(value)),
                          "setting a matmul preference");
  }

  cublasLtMatmulPreference_t pref_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CublasLtGemm>> CublasLtGemm::Create(bool force_fallback) {
  cublasLtHandle_t handle = nullptr;
  MUONSHARD_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle), "cublasLtCreate");
  cublasHandle_t fallback = nullptr;
  absl::Status status = CublasToStatus(cublasCreate(&fallback), "cublasCreate");
  void* workspace = nullptr;
  if (status.ok()) {
    status = CudaToStatus(cudaMalloc(&workspace, kWorkspaceBytes), "allocating the cuBLASLt workspace");
  }
  if (!status.ok()) {
    if (fallback != nullptr) cublasDestroy(fallback);
    cublasLtDestroy(handle);
    return status;
  }
  return std::unique_ptr<CublasLtGemm>(new CublasLtGemm(handle, fallback, workspace, kWorkspaceBytes, force_fallback));
}

CublasLtGemm::CublasLtGemm(cublasLtHandle_t handle, cublasHandle_t fallback, void* workspace, size_t workspace_bytes,
                           bool force_fallback)
    : handle_(handle),
      fallback_(fallback),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      force_fallback_(force_fallback) {}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();
  // cudaFree waits for the device, so no GEMM still uses the workspace.
  cudaFree(workspace_);
  cublasDestroy(fallback_);
  cublasLtDestroy(handle_);
}

absl::StatusOr<const CublasLtGemm::Plan*> CublasLtGemm::GetPlan(const GemmSpec& spec, const PlanKey& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  if (force_fallback_) {
    plan->use_lt = false;
    const Plan* raw = plan.get();
    plans_.emplace(key, std::move(plan));
    return raw;
  }
  const cudaDataType_t type = spec.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  MUONSHARD_RETURN_IF_ERROR(CreateOp(spec.trans_a, spec.trans_b, &plan->op));
  // Stored (pre-op) shapes: op(A) is m x k, op(B) is k x n.
  MUONSHARD_RETURN_IF_ERROR(CreateLayout(type, spec.trans_a ? spec.k : spec.m, spec.trans_a ? spec.m : spec.k, spec.lda,
                                         spec.batch, spec.stride_a, &plan->a));
  MUONSHARD_RETURN_IF_ERROR(CreateLayout(type, spec.trans_b ? spec.n : spec.k, spec.trans_b ? spec.k : spec.n, spec.ldb,
                                         spec.batch, spec.stride_b, &plan->b));
  MUONSHARD_RETURN_IF_ERROR(CreateLayout(type, spec.m, spec.n, spec.ldd, spec.batch, spec.stride_d, &plan->cd));
  Preference pref;
  MUONSHARD_RETURN_IF_ERROR(
      pref.Init(workspace_bytes_, std::get<13>(key), std::get<14>(key), std::get<15>(key), std::get<16>(key)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->cd, plan->cd,
                                                               pref.get(), 1, &result, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && found == 0)) {
    plan->use_lt = false;
  } else {
    MUONSHARD_CUBLAS_RETURN_IF_ERROR(status, "cublasLtMatmulAlgoGetHeuristic");
    plan->algo = result.algo;
  }
  const Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status CublasLtGemm::Run(const GemmSpec& spec, float alpha, const void* a, const void* b, float beta,
                               const void* c, void* d, cudaStream_t stream) {
  if (c == nullptr || beta == 0.0f) c = d;
  const PlanKey key = std::tuple_cat(
      spec.Key(), std::make_tuple(PointerAlignment(a), PointerAlignment(b), PointerAlignment(c), PointerAlignment(d)));
  MUONSHARD_ASSIGN_OR_RETURN(const Plan* plan, GetPlan(spec, key));
  if (!plan->use_lt) return RunFallback(spec, alpha, a, b, beta, c, d, stream);
  return CublasToStatus(cublasLtMatmul(handle_, plan->op, &alpha, a, plan->a, b, plan->b, &beta, c, plan->cd, d,
                                       plan->cd, &plan->algo, workspace_, workspace_bytes_, stream),
                        "cublasLtMatmul");
}

absl::Status CublasLtGemm::RunFallback(const GemmSpec& spec, float alpha, const void* a, const void* b, float beta,
                                       const void* c, void* d, cudaStream_t stream) {
  const size_t es = spec.bf16 ? 2 : 4;
  if (beta != 0.0f && c != d) {
    // cuBLAS reads C from D: copy each matrix of C over.
    for (int32_t i = 0; i < spec.batch; ++i) {
      const size_t offset = es * static_cast<size_t>(spec.stride_d) * i;
      MUONSHARD_CUDA_RETURN_IF_ERROR(
          cudaMemcpy2DAsync(static_cast<char*>(d) + offset, es * spec.ldd, static_cast<const char*>(c) + offset,
                            es * spec.ldd, es * spec.m, spec.n, cudaMemcpyDeviceToDevice, stream),
          "copying C for the cuBLAS fallback");
    }
  }
  MUONSHARD_CUBLAS_RETURN_IF_ERROR(cublasSetStream(fallback_, stream), "cublasSetStream");
  const cudaDataType_t type = spec.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  return CublasToStatus(
      cublasGemmStridedBatchedEx(
          fallback_, spec.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, spec.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
          static_cast<int>(spec.m), static_cast<int>(spec.n), static_cast<int>(spec.k), &alpha, a, type,
          static_cast<int>(spec.lda), spec.stride_a, b, type, static_cast<int>(spec.ldb), spec.stride_b, &beta, d, type,
          static_cast<int>(spec.ldd), spec.stride_d, spec.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
}

}  // namespace muonshard::kernels::internal
