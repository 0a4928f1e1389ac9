// CPU Newton–Schulz on OpenBLAS.
//
// Each matrix G (rows x cols, row-major) is iterated in its own layout: for a
// wide G (rows <= cols) X = G, for a tall one X = Gᵀ, and the transposes are
// folded into the BLAS calls (Trans flags, ssymm from the right), so no data is
// transposed. With `symmetric`, X·Xᵀ and A·A = A·Aᵀ are ssyrk calls that write
// the upper triangle only (about half the FLOPs of sgemm) and B·X is an ssymm
// reading that triangle; A's lower triangle is mirrored once per step because
// ssyrk reads its input as a general matrix.

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "kernels/bf16.h"
#include "kernels/internal/cpu_newton_schulz.h"
#include "kernels/internal/parallel_for.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace internal {
namespace {

double SumSquares(const float* x, int64_t n) {
  double sum_squares = 0;
  for (int64_t i = 0; i < n; ++i) sum_squares += double{x[i]} * x[i];
  return sum_squares;
}

float InverseNorm(double sum_squares, float eps) {
  return static_cast<float>(1.0 / std::max(std::sqrt(sum_squares), static_cast<double>(eps)));
}

void ScaleBy(float* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

// Up to this many multiply-adds per X·Xᵀ (m·m·n), the matrices of a batch run
// one per thread: OpenBLAS splits such small calls poorly. Measured on 2 cores
// (bench/kernels, experts64x128x512): 92 vs 63 GFLOP/s at m²n = 2^23, 89 vs 76
// at 2^26, 46 vs 73 at 2^28. Only the symmetric path: concurrent threaded
// sgemm calls serialise inside OpenBLAS and ran 3x slower. (Both measured
// before ScopedSingleThreadedBlas, when each thread's BLAS calls still went
// to OpenBLAS's pool.)
constexpr double kPerThreadMatrixMaxWork = double{1 << 26};

// Holds OpenBLAS's pool at one thread while it lives, for loops that run
// one matrix per thread: left threaded, every concurrent BLAS call would hand
// its work to the same pool (one thread per core), which queues the callers
// behind each other and oversubscribes the cores. The pool is process-wide,
// so the guards of all threads share one count: the first to enter saves the
// pool size and the last to leave restores it. Other BLAS callers of the
// process run single-threaded meanwhile, while the per-thread loop already
// keeps every core busy.
class ScopedSingleThreadedBlas {
 public:
  ScopedSingleThreadedBlas() {
    std::lock_guard<std::mutex> lock(Mu());
    State& state = GetState();
    if (state.depth++ == 0) {
      state.saved_threads = openblas_get_num_threads();
      if (state.saved_threads != 1) openblas_set_num_threads(1);
    }
  }
  ~ScopedSingleThreadedBlas() {
    std::lock_guard<std::mutex> lock(Mu());
    State& state = GetState();
    if (--state.depth == 0 && state.saved_threads != 1) {
      openblas_set_num_threads(state.saved_threads);
    }
  }
  ScopedSingleThreadedBlas(const ScopedSingleThreadedBlas&) = delete;
  ScopedSingleThreadedBlas& operator=(const ScopedSingleThreadedBlas&) = delete;

 private:
  struct State {
    int depth = 0;
    int saved_threads = 1;
  };
  static std::mutex& Mu() {
    static std::mutex* mu = new std::mutex;
    return *mu;
  }
  static State& GetState() {
    static State* state = new State;
    return *state;
  }
};

// The scratch of the one-matrix-per-thread path is kept by each thread
// between calls, up to this size: allocated afresh per call, glibc hands the
// freed blocks back to the OS and every call page-faults them in again
// (192x512: 55-70 GFLOP/s per MuonUpdate call against 80-100 with the
// scratch kept). Larger scratch (long thin matrices) is freed after a call.
constexpr size_t kMaxKeptScratchBytes = size_t{16} << 20;

CpuNsScratch& KeptScratch() {
  thread_local CpuNsScratch scratch;
  return scratch;
}

void ReleaseIfLarge(CpuNsScratch& scratch) {
  const size_t floats =
      scratch.input.capacity() + scratch.gram.capacity() + scratch.poly.capacity() + scratch.next.capacity();
  if (sizeof(float) * floats > kMaxKeptScratchBytes) scratch = CpuNsScratch();
}

void NormalizeFrobenius(float* x, int64_t n, float eps) { ScaleBy(x, n, InverseNorm(SumSquares(x, n), eps)); }

// Copies the upper triangle of the row-major m x m matrix `a` into its lower
// triangle, in tiles so both the reads and the writes stay in cache.
void MirrorUpperToLower(float* a, int m) {
  constexpr int kTile = 64;
  for (int i0 = 0; i0 < m; i0 += kTile) {
    for (int j0 = 0; j0 <= i0; j0 += kTile) {
      const int i_end = std::min(i0 + kTile, m);
      const int j_end = std::min(j0 + kTile, m);
      for (int i = i0; i < i_end; ++i) {
        for (int j = j0; j < std::min(j_end, i); ++j) {
          a[int64_t{i} * m + j] = a[int64_t{j} * m + i];
        }
      }
    }
  }
}

// Shape of one iterate: G is rows x cols; X is m x n with m <= n.
struct IterShape {
  int rows;
  int cols;
  int m;
  int n;
  bool tall;  // X = Gᵀ.
};

// REQUIRES: rows and cols fit a BLAS int (ValidateMatrixBatchShape).
IterShape MakeIterShape(int64_t rows, int64_t cols) {
  const int r = static_cast<int>(rows);
  const int c = static_cast<int>(cols);
  return {r, c, std::min(r, c), std::max(r, c), r > c};
}

// gram = X·Xᵀ (upper triangle only when symmetric).
void Gram(const float* g, const IterShape& s, bool symmetric, float* gram) {
  if (symmetric) {
    cblas_ssyrk(CblasRowMajor, CblasUpper, s.tall ? CblasTrans : CblasNoTrans, s.m, s.n, 1.0f, g, s.cols, 0.0f, gram,
                s.m);
  } else if (s.tall) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s.m, s.m, s.n, 1.0f, g, s.cols, g, s.cols, 0.0f, gram, s.m);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.m, s.n, 1.0f, g, s.cols, g, s.cols, 0.0f, gram, s.m);
  }
}

// poly = b·gram + c·gram·gram. REQUIRES: gram is full (both triangles).
void Polynomial(const float* gram, int m, const NsCoefficients& k, bool symmetric, float* poly) {
  std::memcpy(poly, gram, sizeof(float) * m * m);
  if (symmetric) {
    // gram is symmetric, so gram·gram = gram·gramᵀ.
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, m, m, k.c, gram, m, k.b, poly, m);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, k.c, gram, m, gram, m, k.b, poly, m);
  }
}

// next = a·X + poly·X, written in G's layout (for tall G: a·G + G·polyᵀ).
void Update(const float* g, const float* poly, const IterShape& s, float a, bool symmetric, float* next) {
  std::memcpy(next, g, sizeof(float) * s.rows * s.cols);
  if (symmetric) {
    cblas_ssymm(CblasRowMajor, s.tall ? CblasRight : CblasLeft, CblasUpper, s.rows, s.cols, 1.0f, poly, s.m, g, s.cols,
                a, next, s.cols);
  } else if (s.tall) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.rows, s.cols, s.cols, 1.0f, g, s.cols, poly, s.m, a, next,
                s.cols);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.rows, s.cols, s.rows, 1.0f, poly, s.m, g, s.cols, a, next,
                s.cols);
  }
}

void MaybeRoundToBf16(bool bf16, float* data, int64_t n) {
  if (bf16) RoundToBf16InPlace(data, n);
}

// One step of the iteration on `x` given its Gram matrix `gram` (full, both
// triangles; rounded here): x = a·x + (b·A + c·A·A)·x in G's layout.
void IterateWithGram(float* x, float* gram, const IterShape& s, const NsCoefficients& k, const CpuNsConfig& cfg,
                     CpuNsScratch& scratch) {
  const int64_t gram_elements = int64_t{s.m} * s.m;
  const int64_t elements = int64_t{s.rows} * s.cols;
  MaybeRoundToBf16(cfg.bf16, gram, gram_elements);
  scratch.poly.resize(gram_elements);
  scratch.next.resize(elements);
  Polynomial(gram, s.m, k, cfg.symmetric, scratch.poly.data());
  MaybeRoundToBf16(cfg.bf16, scratch.poly.data(), gram_elements);
  Update(x, scratch.poly.data(), s, k.a, cfg.symmetric, scratch.next.data());
  MaybeRoundToBf16(cfg.bf16, scratch.next.data(), elements);
  std::memcpy(x, scratch.next.data(), sizeof(float) * elements);
}

}  // namespace

void OrthogonalizeMatrixCpu(float* g, int64_t rows, int64_t cols, const CpuNsConfig& cfg, CpuNsScratch& scratch) {
  const IterShape s = MakeIterShape(rows, cols);
  const int64_t elements = rows * cols;
  NormalizeFrobenius(g, elements, cfg.eps);
  MaybeRoundToBf16(cfg.bf16, g, elements);
  scratch.gram.resize(int64_t{s.m} * s.m);
  for (int step = 0; step < cfg.steps; ++step) {
    Gram(g, s, cfg.symmetric, scratch.gram.data());
    if (cfg.symmetric) MirrorUpperToLower(scratch.gram.data(), s.m);
    IterateWithGram(g, scratch.gram.data(), s, cfg.coefficients[step % cfg.coefficients.size()], cfg, scratch);
  }
}

absl::StatusOr<CpuNsConfig> MakeCpuNsConfig(const NewtonSchulzOptions& options) {
  CpuNsConfig config;
  MUONSHARD_ASSIGN_OR_RETURN(config.coefficients, ResolveNsCoefficients(options));
  config.steps = options.steps;
  config.eps = options.eps;
  // Paddle computes in fp32 off CUDA; bf16 here emulates the GPU's rounding.
  config.bf16 = options.precision == MatmulPrecision::kBf16;
  // ssyrk/ssymm beat sgemm at every size measured (bench/kernels).
  config.symmetric = options.symmetric != SymmetricMatmul::kNever;
  return config;
}

bool RunsMatricesPerThread(int64_t rows, int64_t cols, const CpuNsConfig& config) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double work = m * m * static_cast<double>(std::max(rows, cols));
  return config.symmetric && work <= kPerThreadMatrixMaxWork;
}

void ForEachMatrixCpu(int64_t count, int64_t rows, int64_t cols, const CpuNsConfig& config,
                      absl::FunctionRef<void(int64_t, CpuNsScratch&)> fn) {
  if (!RunsMatricesPerThread(rows, cols, config)) {
    CpuNsScratch scratch;
    for (int64_t i = 0; i < count; ++i) fn(i, scratch);
    return;
  }
  // Single-threaded BLAS even for one matrix: OpenBLAS's results depend on
  // its thread count, and a matrix must come out the same whichever call
  // (one 2-D MuonUpdate, a stack, a MuonUpdateBatch) and thread handled it.
  ScopedSingleThreadedBlas single_threaded_blas;
  // Each thread takes the next matrix when it is done with one, so a thread
  // the OS parks (a busy, shared machine) does not hold back a fixed share.
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(DefaultCpuThreads(), count);
  ParallelForRange(threads, static_cast<int>(threads), [&](int64_t, int64_t) {
    CpuNsScratch& scratch = KeptScratch();
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
      fn(i, scratch);
    }
    ReleaseIfLarge(scratch);
  });
}

void OrthogonalizeBatchCpu(float* data, const MatrixBatchShape& shape, const CpuNsConfig& config) {
  const int64_t per_matrix = shape.matrix_elements();
  ForEachMatrixCpu(shape.batch, shape.rows, shape.cols, config, [&](int64_t i, CpuNsScratch& scratch) {
    OrthogonalizeMatrixCpu(data + i * per_matrix, shape.rows, shape.cols, config, scratch);
  });
}

}  // namespace internal

namespace {

// The iteration of a shard (NOTE [Sharded Newton–Schulz]): kCols iterates
// X = S (m = rows), kRows X = Sᵀ (m = cols), whatever the shard's own aspect.
internal::IterShape ShardIterShape(const MatrixBatchShape& shape, NsShardSplit split) {
  const int r = static_cast<int>(shape.rows);
  const int c = static_cast<int>(shape.cols);
  return split == NsShardSplit::kCols ? internal::IterShape{r, c, r, c, false} : internal::IterShape{r, c, c, r, true};
}

}  // namespace

absl::Status NewtonSchulzShardCpu(const float* in, float* out, const MatrixBatchShape& shard_shape, NsShardSplit split,
                                  const NewtonSchulzOptions& options, NsAllReduce all_reduce) {
  if (in == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("NewtonSchulzShardCpu: null input or output");
  }
  MUONSHARD_RETURN_IF_ERROR(ValidateMatrixBatchShape(shard_shape));
  MUONSHARD_ASSIGN_OR_RETURN(internal::CpuNsConfig config, internal::MakeCpuNsConfig(options));
  if (out != in) std::memcpy(out, in, sizeof(float) * shard_shape.elements());
  const internal::IterShape s = ShardIterShape(shard_shape, split);
  const int64_t batch = shard_shape.batch;
  const int64_t per_matrix = shard_shape.matrix_elements();
  const int64_t gram_elements = int64_t{s.m} * s.m;

  std::vector<float> norms(batch);
  for (int64_t i = 0; i < batch; ++i)
    norms[i] = static_cast<float>(internal::SumSquares(out + i * per_matrix, per_matrix));
  MUONSHARD_RETURN_IF_ERROR(all_reduce(norms.data(), batch));
  for (int64_t i = 0; i < batch; ++i) {
    internal::ScaleBy(out + i * per_matrix, per_matrix, internal::InverseNorm(norms[i], config.eps));
    internal::MaybeRoundToBf16(config.bf16, out + i * per_matrix, per_matrix);
  }

  std::vector<float> grams(batch * gram_elements);
  for (int step = 0; step < config.steps; ++step) {
    const NsCoefficients& k = config.coefficients[step % config.coefficients.size()];
    internal::ForEachMatrixCpu(batch, shard_shape.rows, shard_shape.cols, config,
                               [&](int64_t i, internal::CpuNsScratch&) {
                                 float* gram = grams.data() + i * gram_elements;
                                 internal::Gram(out + i * per_matrix, s, config.symmetric, gram);
                                 if (config.symmetric) internal::MirrorUpperToLower(gram, s.m);
                               });
    MUONSHARD_RETURN_IF_ERROR(all_reduce(grams.data(), batch * gram_elements));
    internal::ForEachMatrixCpu(
        batch, shard_shape.rows, shard_shape.cols, config, [&](int64_t i, internal::CpuNsScratch& scratch) {
          internal::IterateWithGram(out + i * per_matrix, grams.data() + i * gram_elements, s, k, config, scratch);
        });
  }
  return absl::OkStatus();
}

absl::Status NewtonSchulzCpu(const float* in, float* out, const MatrixBatchShape& shape,
                             const NewtonSchulzOptions& options) {
  if (in == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("NewtonSchulzCpu: null input or output");
  }
  MUONSHARD_RETURN_IF_ERROR(ValidateMatrixBatchShape(shape));
  MUONSHARD_ASSIGN_OR_RETURN(internal::CpuNsConfig config, internal::MakeCpuNsConfig(options));
  if (out != in) {
    std::memcpy(out, in, sizeof(float) * shape.elements());
  }
  internal::OrthogonalizeBatchCpu(out, shape, config);
  return absl::OkStatus();
}

}  // namespace muonshard::kernels
