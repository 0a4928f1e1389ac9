#ifndef MUONSHARD_KERNELS_NEWTON_SCHULZ_H_
#define MUONSHARD_KERNELS_NEWTON_SCHULZ_H_

// Newton–Schulz orthogonalisation, the core of the Muon update.
//
// Input: a batch of `batch` row-major fp32 matrices of `rows` x `cols` (batch
// is 1 for a 2-D parameter and the number of experts for a 3-D stack; several
// same-shape matrices packed back to back also form a batch). Each matrix G is
// processed independently, following Paddle's `_zeropower_via_newtonschulz5`
// (docs/reference/paddle_internals.md §3.3):
//
//   X = G, or Gᵀ when rows > cols             (iterate on the smaller Gram)
//   X = X / max(‖X‖_F, eps)                   (per matrix, in fp32)
//   X = bf16(X)                               (bf16 precision only)
//   for i in 0 .. steps-1:
//     (a, b, c) = coefficients[i % len(coefficients)]
//     A = X·Xᵀ
//     B = b·A + c·A·A
//     X = a·X + B·X
//   return Xᵀ if transposed else X
//
// With bf16 precision every matmul reads bf16 operands, accumulates in fp32
// and rounds its result to bf16 (cuBLAS bf16 GEMMs; the CPU emulates the same
// rounding points with fp32 BLAS), so the output values are bf16-representable.
//
// Cost per step for m = min(rows, cols), n = max(rows, cols):
// 2m²n (X·Xᵀ) + 2m³ (A·A) + 2m²n (B·X) = 4m²n + 2m³ FLOPs. X·Xᵀ and A·A are
// symmetric; the implementations may compute one triangle only (see
// SymmetricMatmul), which does not change the result beyond rounding.
//
// Defaults are Paddle's: the "simple" coefficients (3.4445, -4.7750, 2.0315),
// 5 steps, and eps = 1e-9 because Paddle passes `adam_epsilon` (1e-9) as the
// normalisation epsilon (Keller Jordan's and Moonlight's code use 1e-7).

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonshard::kernels {

// Shape of a batch of row-major matrices stored back to back.
struct MatrixBatchShape {
  int64_t batch = 1;
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t matrix_elements() const { return rows * cols; }
  int64_t elements() const { return batch * rows * cols; }
};

// Validates a shape for the kernels: every dimension >= 1, rows and cols fit
// a 32-bit BLAS integer, and the element count does not overflow.
// Possible errors: INVALID_ARGUMENT.
absl::Status ValidateMatrixBatchShape(const MatrixBatchShape& shape);

struct NsCoefficients {
  float a = 0;
  float b = 0;
  float c = 0;
};

// Coefficient schedules; step i uses entry i % size (docs/reference/paddle_internals.md §3.3).
enum class NsCoefficientSet {
  kSimple,        // Keller Jordan's (3.4445, -4.7750, 2.0315); Paddle's default.
  kQuintic,       // 5 tuned tuples.
  kPolarExpress,  // Polar Express, 8 tuples, safety factor folded in.
  kAol,           // 4 tuples for AOL-preconditioned inputs.
  kDeepseekV4,    // simple x 8 then (2.0, -1.5, 0.5) x 2.
  kCustom,        // NewtonSchulzOptions::custom_coefficients.
};

// Precision of the matmuls inside the iteration.
enum class MatmulPrecision {
  kDefault,  // Paddle's choice: bf16 on CUDA, fp32 on CPU.
  kBf16,     // bf16 operands and results, fp32 accumulation.
  kFp32,     // fp32 throughout.
};

// Whether the symmetric products X·Xᵀ and A·A compute one triangle only
// (SYRK on the CPU, panel GEMMs on CUDA) and mirror it.
enum class SymmetricMatmul {
  kAuto,  // Use it where it is faster: always on the CPU, large m on CUDA.
  kAlways,
  kNever,
};

struct NewtonSchulzOptions {
  NsCoefficientSet coefficient_set = NsCoefficientSet::kSimple;
  // Used only with kCustom (and then required to be non-empty).
  std::vector<NsCoefficients> custom_coefficients;
  int steps = 5;
  // Normalisation epsilon; Paddle uses adam_epsilon (1e-9) here.
  float eps = 1e-9f;
  MatmulPrecision precision = MatmulPrecision::kDefault;
  SymmetricMatmul symmetric = SymmetricMatmul::kAuto;
};

// The coefficient schedule of a built-in set. REQUIRES: set != kCustom.
const std::vector<NsCoefficients>& BuiltinNsCoefficients(NsCoefficientSet set);

// The schedule `options` selects, after validating the options (steps >= 0,
// eps > 0 and finite, finite coefficients, a non-empty custom list exactly
// when the set is kCustom). Possible errors: INVALID_ARGUMENT.
absl::StatusOr<std::vector<NsCoefficients>> ResolveNsCoefficients(const NewtonSchulzOptions& options);

// FLOPs of one Newton–Schulz call, counted as full (non-symmetric) matmuls:
// batch · steps · (4m²n + 2m³), m = min(rows, cols), n = max(rows, cols).
double NewtonSchulzFlops(const MatrixBatchShape& shape, int steps);

// NOTE [Sharded Newton–Schulz]: Newton–Schulz of a matrix whose shards lie
// on several ranks (its tensor-parallel shards, Megatron's `distributed` TP
// mode), without gathering it. The shards split the whole matrix G along
// its long side n, so the Gram matrix of the iteration is a sum over them:
//
//   kCols: G = [S_1 ... S_k] (rows <= cols), A = Σ S_t·S_tᵀ, S_t ← a·S_t + B·S_t
//   kRows: G = [S_1; ...; S_k] (rows >= cols), A = Σ S_tᵀ·S_t, S_t ← a·S_t + S_t·B
//
// (kRows is the transposed iteration X = Gᵀ written in G's layout; for a
// square G it computes p(GᵀG)·G where NewtonSchulz computes p(GGᵀ)·G, the
// same matrix.) Each rank iterates its own shard: the squared Frobenius norm
// and, every step, the m x m Gram matrix (m = min(rows, cols) of G) are
// summed over the ranks by `all_reduce`; B = b·A + c·A·A is computed on every
// rank. The rounding points are NewtonSchulz's (the Gram matrix is rounded to
// bf16 after the sum), so the result is the whole matrix's NS up to the order
// of the sums (bit-identical for one shard). Per step and rank:
// 4m²(n/k) + 2m³ FLOPs and one all-reduce of m² floats per matrix.
enum class NsShardSplit {
  kCols,  // shards are column blocks of a wide (or square) matrix
  kRows,  // shards are row blocks of a tall (or square) matrix
};

// Sums `n` floats at `data` (backend memory) over the ranks that hold the
// shards, in place, and returns when the sum is there. Called with every
// earlier kernel of the call complete.
using NsAllReduce = absl::FunctionRef<absl::Status(float* data, int64_t n)>;

// The side m of the Gram matrix of a shard of `shard_shape` split `split`.
int64_t NsShardGramSide(const MatrixBatchShape& shard_shape, NsShardSplit split);

// FLOPs of one sharded Newton–Schulz call on one rank, as NewtonSchulzFlops
// counts them: batch · steps · (4m²n_local + 2m³).
double NsShardFlops(const MatrixBatchShape& shard_shape, NsShardSplit split, int steps);

// CPU implementation (OpenBLAS). `in` and `out` are host pointers to
// shape.elements() floats; `out` may equal `in` (in-place) but must not
// otherwise overlap it. Blocks until done. Large matrices run one after
// another on OpenBLAS's threads; small ones (symmetric path) one per thread
// over the batch, with OpenBLAS held at one thread meanwhile (process-wide),
// even for a batch of one, so a matrix's result never depends on the batch
// it came in.
// Possible errors: INVALID_ARGUMENT (null pointer, bad shape or options).
absl::Status NewtonSchulzCpu(const float* in, float* out, const MatrixBatchShape& shape,
                             const NewtonSchulzOptions& options);

// CPU implementation of NOTE [Sharded Newton–Schulz]: `in` and `out` are
// host pointers to shard_shape.elements() floats, this rank's shard of each
// of shard_shape.batch matrices; `out` may equal `in`. `all_reduce` is
// called 1 + steps times, with batch floats (the squared norms) and then
// batch · m² floats (the Gram matrices), on every rank in the same order.
// Possible errors: INVALID_ARGUMENT (null pointer, bad shape or options),
// and whatever `all_reduce` returns.
absl::Status NewtonSchulzShardCpu(const float* in, float* out, const MatrixBatchShape& shard_shape, NsShardSplit split,
                                  const NewtonSchulzOptions& options, NsAllReduce all_reduce);

}  // namespace muonshard::kernels

#endif  // MUONSHARD_KERNELS_NEWTON_SCHULZ_H_
