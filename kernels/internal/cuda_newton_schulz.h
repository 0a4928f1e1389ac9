#ifndef MUONSHARD_KERNELS_INTERNAL_CUDA_NEWTON_SCHULZ_H_
#define MUONSHARD_KERNELS_INTERNAL_CUDA_NEWTON_SCHULZ_H_

// The CUDA Newton–Schulz iteration, shared by CudaKernelBackend::NewtonSchulz
// and ::MuonUpdate.
//
// Each matrix G (rows x cols, row-major) is the column-major matrix
// S = Gᵀ (cols x rows) to cuBLAS. For a wide G, X = G = Sᵀ; for a tall one
// X = Gᵀ = S. Per step (all strided-batched over the matrices):
//   A  = X·Xᵀ              wide: Sᵀ·S     tall: S·Sᵀ
//   B  = b·A + c·A·A       C = A, D = B   (cuBLASLt, no copy)
//   X' = a·X + B·X         wide: S' = a·S + S·Bᵀ   tall: S' = a·S + B·S
// so the iterate stays in G's own layout and no transpose is ever made.
//
// Symmetric mode computes A and B as "row panels": rows [p_i, p_{i+1}) of
// columns [p_i, m), i.e. the block upper triangle (about (T+1)/2T of the
// FLOPs for T panels), then mirrors the upper triangle onto the lower one.
// Panel boundaries are multiples of 128 elements so every panel pointer keeps
// cuBLASLt's 256-byte alignment.
//
// Sharded (NOTE [Sharded Newton–Schulz] in newton_schulz.h): a shard iterates
// X = S for kCols and X = Sᵀ for kRows (m = NsShardGramSide), whatever its own
// aspect, through the same GEMMs. The Gram matrices must be summed over the
// ranks in fp32 before they are rounded, and the GEMMs here read and write
// one element type, so A is an fp32 GEMM of an fp32 copy of the iterate
// (kept in the caller's output, which thereby holds the result at the end);
// after the all-reduce A is rounded to bf16 (bf16 precision) and B and X'
// run as above. fp32 products of bf16 values are exact, so this rounds where
// NewtonSchulz does.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/internal/cublaslt_gemm.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels::internal {

// kAuto uses symmetric (panel) GEMMs from this short side up: below it the
// saved FLOPs (25% of A and B with two panels) do not pay for the mirror
// passes and the smaller GEMMs. Chosen from the published SYRK gating
// (Paddle#79694: no win below ~2048) without a local GPU;
// muonshard-bench-kernels-gpu reports symmetric vs plain to confirm it.
constexpr int64_t kAutoSymmetricMinDim = 4096;
// Target panel height; 2 to 8 panels.
constexpr int64_t kPanelHeight = 2048;

// NewtonSchulzOptions resolved for CUDA and a shape.
struct CudaNsConfig {
  std::vector<NsCoefficients> coefficients;
  int steps = 0;
  float eps = 0;
  bool bf16 = true;
  // Row-panel boundaries of the m x m products: {0, m} for plain GEMMs.
  std::vector<int64_t> panels;

  bool symmetric() const { return panels.size() > 2; }
};

// `bf16_by_default` is what MatmulPrecision::kDefault means on this device.
// Possible errors: INVALID_ARGUMENT (see ResolveNsCoefficients).
absl::StatusOr<CudaNsConfig> MakeCudaNsConfig(const NewtonSchulzOptions& options, const MatrixBatchShape& shape,
                                              bool bf16_by_default);

// Whether `mode` selects symmetric panel GEMMs for `shape`.
bool UseSymmetricPanels(const MatrixBatchShape& shape, SymmetricMatmul mode);

// Boundaries 0 = p_0 < p_1 < ... < p_T = m of `count` panels, interior ones
// rounded down to multiples of 128 (empty panels dropped).
std::vector<int64_t> PanelBounds(int64_t m, int count);

// Device work buffers of one call, carved out of one workspace allocation.
struct NsBuffers {
  double* sums = nullptr;   // Per-matrix Σx², batch entries.
  float* update = nullptr;  // Muon's momentum output (batch x per_matrix).
  void* x = nullptr;        // Iterate, batch x x_stride elements.
  void* y = nullptr;        // Next iterate, same size.
  void* gram = nullptr;     // A, batch x gram_stride elements.
  void* poly = nullptr;     // B, same size.
  int64_t x_stride = 0;     // Elements between matrices in x and y.
  int64_t gram_stride = 0;  // Elements between matrices in gram and poly.
};

// Bytes of workspace CarveNsBuffers needs.
size_t NsWorkspaceBytes(const MatrixBatchShape& shape, bool bf16, bool with_update);
NsBuffers CarveNsBuffers(void* workspace, const MatrixBatchShape& shape, bool bf16, bool with_update);

// Normalises `source` (batch x per_matrix fp32, whose per-matrix Σx² is in
// buffers.sums) into buffers.x and runs the iterations. Returns the buffer
// holding the result (buffers.x or buffers.y, with x_stride), in bf16 or
// fp32 per config.bf16. Enqueues only; never waits for the device.
// Possible errors: INTERNAL.
absl::StatusOr<const void*> OrthogonalizeOnDevice(const float* source, const NsBuffers& buffers,
                                                  const MatrixBatchShape& shape, const CudaNsConfig& config,
                                                  CublasLtGemm& gemm, cudaStream_t stream);

// --- Sharded Newton–Schulz.

// NewtonSchulzOptions resolved for a shard of `shard_shape` split `split`:
// MakeCudaNsConfig for the batch of m x m products (m = NsShardGramSide),
// which picks the symmetric panels by m.
// Possible errors: INVALID_ARGUMENT (bad options, or more than 2^48 Gram
// elements in all).
absl::StatusOr<CudaNsConfig> MakeCudaNsShardConfig(const NewtonSchulzOptions& options,
                                                   const MatrixBatchShape& shard_shape, NsShardSplit split,
                                                   bool bf16_by_default);

// Device work buffers of one sharded call. The m x m buffers are contiguous
// (m² elements apart) so that the all-reduced Gram matrices are exactly
// batch · m² floats.
struct NsShardBuffers {
  // sums (batch), x and y (the iterate at the GEMM precision, x_stride
  // apart), gram (A at the GEMM precision) and poly (B), gram_stride = m²;
  // no update.
  NsBuffers ns;
  float* norms = nullptr;  // Squared norms, batch floats; all-reduced.
  float* grams = nullptr;  // fp32 Gram matrices, batch · m²; all-reduced.
                           // Also ns.gram in fp32.
};

// Bytes of workspace CarveNsShardBuffers needs. REQUIRES: a shape that
// MakeCudaNsShardConfig accepts.
size_t NsShardWorkspaceBytes(const MatrixBatchShape& shard_shape, NsShardSplit split, bool bf16);
NsShardBuffers CarveNsShardBuffers(void* workspace, const MatrixBatchShape& shard_shape, NsShardSplit split, bool bf16);

// Orthogonalises the shards `in` into `out` (shard_shape.elements() fp32
// each; `out` may equal `in`). Enqueues on `stream` and waits for it before
// each of the 1 + config.steps calls of `all_reduce` (the squared norms,
// then the Gram matrices of every step); returns with the last step
// enqueued. `out` holds the fp32 iterate from the normalisation on.
// Possible errors: INTERNAL, and whatever `all_reduce` returns.
absl::Status OrthogonalizeShardOnDevice(const float* in, float* out, const NsShardBuffers& buffers,
                                        const MatrixBatchShape& shard_shape, NsShardSplit split,
                                        const CudaNsConfig& config, CublasLtGemm& gemm, cudaStream_t stream,
                                        NsAllReduce all_reduce);

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_CUDA_NEWTON_SCHULZ_H_
