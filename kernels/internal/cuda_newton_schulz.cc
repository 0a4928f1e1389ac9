#include "kernels/internal/cuda_newton_schulz.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/bf16.h"
#include "kernels/cuda_status.h"
#include "kernels/internal/cublaslt_gemm.h"
#include "kernels/internal/cuda_elementwise.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels::internal {
namespace {

// Every matrix and panel starts 256-byte aligned: 128 bf16 or 64 fp32
// elements; 128 elements covers both.
constexpr int64_t kAlignElements = 128;
constexpr size_t kAlignBytes = 256;

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
size_t RoundUpBytes(size_t x) { return (x + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

// The iterate's geometry: G is rows x cols, X is m x n with m <= n.
struct Geometry {
  explicit Geometry(const MatrixBatchShape& s)
      : rows(s.rows),
        cols(s.cols),
        m(std::min(s.rows, s.cols)),
        n(std::max(s.rows, s.cols)),
        tall(s.rows > s.cols),
        batch(static_cast<int32_t>(s.batch)) {}
  // A shard's iterate: X = S for kCols, X = Sᵀ for kRows, whatever the
  // shard's own aspect.
  Geometry(const MatrixBatchShape& s, NsShardSplit split)
      : rows(s.rows),
        cols(s.cols),
        m(NsShardGramSide(s, split)),
        n(split == NsShardSplit::kCols ? s.cols : s.rows),
        tall(split == NsShardSplit::kRows),
        batch(static_cast<int32_t>(s.batch)) {}
  int64_t rows, cols, m, n;
  bool tall;
  int32_t batch;
};

struct Strides {
  int64_t x;     // Between matrices of X/Y (elements).
  int64_t gram;  // Between matrices of A/B.
};

Strides StridesFor(const MatrixBatchShape& shape) {
  const int64_t m = std::min(shape.rows, shape.cols);
  return {RoundUp(shape.rows * shape.cols, kAlignElements), RoundUp(m * m, kAlignElements)};
}

const char* Offset(const void* base, int64_t elements, int64_t element_bytes) {
  return static_cast<const char*>(base) + elements * element_bytes;
}

char* Offset(void* base, int64_t elements, int64_t element_bytes) {
  return static_cast<char*>(base) + elements * element_bytes;
}

// Everything one step needs besides the coefficients.
struct StepContext {
  const Geometry& g;
  const NsBuffers& buf;
  const CudaNsConfig& config;
  CublasLtGemm& gemm;
  cudaStream_t stream;
  int64_t es() const { return config.bf16 ? 2 : 4; }
};

// gram = X·Xᵀ, panel by panel.
absl::Status Gram(const StepContext& ctx, const void* x) {
  const Geometry& g = ctx.g;
  for (size_t i = 0; i + 1 < ctx.config.panels.size(); ++i) {
    const int64_t p0 = ctx.config.panels[i], p1 = ctx.config.panels[i + 1];
    GemmSpec spec;
    spec.bf16 = ctx.config.bf16;
    spec.trans_a = !g.tall;  // Wide: Sᵀ·S. Tall: S·Sᵀ.
    spec.trans_b = g.tall;
    spec.m = p1 - p0;
    spec.n = g.m - p0;
    spec.k = g.n;
    spec.lda = spec.ldb = g.cols;
    spec.ldd = g.m;
    spec.batch = g.batch;
    spec.stride_a = spec.stride_b = ctx.buf.x_stride;
    spec.stride_d = ctx.buf.gram_stride;
    // Rows p0.. of X: columns of S when wide, rows of S when tall.
    const void* rows = Offset(x, g.tall ? p0 : p0 * g.cols, ctx.es());
    MUONSHARD_RETURN_IF_ERROR(
        ctx.gemm.Run(spec, 1.0f, rows, rows, 0.0f, nullptr, Offset(ctx.buf.gram, p0 + p0 * g.m, ctx.es()), ctx.stream));
  }
  return absl::OkStatus();
}

// poly = b·gram + c·gram·gram, panel by panel. REQUIRES: gram full.
absl::Status Polynomial(const StepContext& ctx, const NsCoefficients& k) {
  const int64_t m = ctx.g.m;
  for (size_t i = 0; i + 1 < ctx.config.panels.size(); ++i) {
    const int64_t p0 = ctx.config.panels[i], p1 = ctx.config.panels[i + 1];
    GemmSpec spec;
    spec.bf16 = ctx.config.bf16;
    spec.m = p1 - p0;
    spec.n = m - p0;
    spec.k = m;
    spec.lda = spec.ldb = spec.ldd = m;
    spec.batch = ctx.g.batch;
    spec.stride_a = spec.stride_b = spec.stride_d = ctx.buf.gram_stride;
    const int64_t corner = p0 + p0 * m;
    MUONSHARD_RETURN_IF_ERROR(
        ctx.gemm.Run(spec, k.c, Offset(ctx.buf.gram, p0, ctx.es()), Offset(ctx.buf.gram, p0 * m, ctx.es()), k.b,
                     Offset(ctx.buf.gram, corner, ctx.es()), Offset(ctx.buf.poly, corner, ctx.es()), ctx.stream));
  }
  return absl::OkStatus();
}

// next = a·X + poly·X in G's layout.
absl::Status Update(const StepContext& ctx, float a, const void* x, void* next) {
  const Geometry& g = ctx.g;
  GemmSpec spec;
  spec.bf16 = ctx.config.bf16;
  spec.m = g.cols;
  spec.n = g.rows;
  spec.ldd = g.cols;
  spec.batch = g.batch;
  spec.stride_d = ctx.buf.x_stride;
  const void* lhs = x;
  const void* rhs = ctx.buf.poly;
  if (g.tall) {  // S' = a·S + B·S.
    spec.k = g.cols;
    spec.lda = g.m;
    spec.ldb = g.cols;
    spec.stride_a = ctx.buf.gram_stride;
    spec.stride_b = ctx.buf.x_stride;
    std::swap(lhs, rhs);
  } else {  // S' = a·S + S·Bᵀ.
    spec.trans_b = true;
    spec.k = g.rows;
    spec.lda = g.cols;
    spec.ldb = g.m;
    spec.stride_a = ctx.buf.x_stride;
    spec.stride_b = ctx.buf.gram_stride;
  }
  return ctx.gemm.Run(spec, 1.0f, lhs, rhs, a, x, next, ctx.stream);
}

absl::Status Mirror(const StepContext& ctx, void* matrices) {
  const cudaError_t error = ctx.config.bf16 ? LaunchMirrorUpperToLower(static_cast<Bf16Bits*>(matrices), ctx.g.m,
                                                                       ctx.g.batch, ctx.buf.gram_stride, ctx.stream)
                                            : LaunchMirrorUpperToLower(static_cast<float*>(matrices), ctx.g.m,
                                                                       ctx.g.batch, ctx.buf.gram_stride, ctx.stream);
  return CudaToStatus(error, "mirroring a symmetric product");
}

// gram = X·Xᵀ, both triangles.
absl::Status FullGram(const StepContext& ctx, const void* x) {
  MUONSHARD_RETURN_IF_ERROR(Gram(ctx, x));
  return ctx.config.symmetric() ? Mirror(ctx, ctx.buf.gram) : absl::OkStatus();
}

// next = a·X + (b·A + c·A·A)·X given the full A in gram.
absl::Status IterateWithGram(const StepContext& ctx, const NsCoefficients& k, const void* x, void* next) {
  MUONSHARD_RETURN_IF_ERROR(Polynomial(ctx, k));
  if (ctx.config.symmetric()) MUONSHARD_RETURN_IF_ERROR(Mirror(ctx, ctx.buf.poly));
  return Update(ctx, k.a, x, next);
}

absl::Status Step(const StepContext& ctx, const NsCoefficients& k, const void* x, void* next) {
  MUONSHARD_RETURN_IF_ERROR(FullGram(ctx, x));
  return IterateWithGram(ctx, k, x, next);
}

// Byte offsets of NsShardBuffers in the workspace, and its size.
struct ShardLayout {
  size_t sums = 0, norms = 0, grams = 0, gram = 0, poly = 0, x = 0, y = 0;
  size_t bytes = 0;
};

ShardLayout LayOutShard(const MatrixBatchShape& shape, NsShardSplit split, bool bf16) {
  const int64_t m = NsShardGramSide(shape, split);
  const size_t gram_elements = static_cast<size_t>(shape.batch * m * m);
  const size_t x_elements = static_cast<size_t>(shape.batch * RoundUp(shape.matrix_elements(), kAlignElements));
  const size_t es = bf16 ? 2 : 4;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t offset = at;
    at += RoundUpBytes(bytes);
    return offset;
  };
  ShardLayout layout;
  layout.sums = take(sizeof(double) * shape.batch);
  layout.norms = take(sizeof(float) * shape.batch);
  layout.grams = take(sizeof(float) * gram_elements);
  layout.gram = bf16 ? take(es * gram_elements) : layout.grams;
  layout.poly = take(es * gram_elements);
  layout.x = take(es * x_elements);
  layout.y = take(es * x_elements);
  layout.bytes = at;
  return layout;
}

// Waits for `stream`, whose kernels wrote `data`, then sums it over the ranks.
absl::Status AllReduceAfter(cudaStream_t stream, float* data, int64_t n, NsAllReduce all_reduce) {
  MUONSHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "waiting for the kernel stream before an all-reduce");
  return all_reduce(data, n);
}

// buffers.ns.x = T(in / max(‖G‖_F, eps)) per matrix, with ‖G‖_F² summed over
// the shards; the summed float goes back to double for the reciprocal, as on
// the CPU.
absl::Status NormalizeShard(const float* in, const NsShardBuffers& buffers, const MatrixBatchShape& shape,
                            const CudaNsConfig& config, cudaStream_t stream, NsAllReduce all_reduce) {
  const int64_t batch = shape.batch;
  const int64_t per_matrix = shape.matrix_elements();
  const NsBuffers& ns = buffers.ns;
  MUONSHARD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ns.sums, 0, sizeof(double) * batch, stream),
                                 "clearing the norm accumulators");
  MUONSHARD_CUDA_RETURN_IF_ERROR(LaunchSumSquares(in, batch, per_matrix, ns.sums, stream), "summing squares");
  MUONSHARD_CUDA_RETURN_IF_ERROR(LaunchDoubleToFloat(ns.sums, buffers.norms, batch, stream),
                                 "narrowing the squared norms");
  MUONSHARD_RETURN_IF_ERROR(AllReduceAfter(stream, buffers.norms, batch, all_reduce));
  MUONSHARD_CUDA_RETURN_IF_ERROR(LaunchFloatToDouble(buffers.norms, ns.sums, batch, stream),
                                 "widening the summed squared norms");
  const cudaError_t normalized = config.bf16 ? LaunchNormalize(in, batch, per_matrix, ns.sums, config.eps, ns.x_stride,
                                                               static_cast<Bf16Bits*>(ns.x), stream)
                                             : LaunchNormalize(in, batch, per_matrix, ns.sums, config.eps, ns.x_stride,
                                                               static_cast<float*>(ns.x), stream);
  return CudaToStatus(normalized, "normalising the NS input");
}

// out = fp32(x): the iterate for the next fp32 Gram matrix, and the result
// after the last step.
absl::Status PublishIterate(const StepContext& ctx, const void* x, float* out) {
  const int64_t batch = ctx.g.batch;
  const int64_t per_matrix = ctx.g.rows * ctx.g.cols;
  if (ctx.config.bf16) {
    return CudaToStatus(
        LaunchWiden(static_cast<const Bf16Bits*>(x), batch, per_matrix, ctx.buf.x_stride, out, ctx.stream),
        "widening the NS iterate");
  }
  return CudaToStatus(cudaMemcpy2DAsync(out, sizeof(float) * per_matrix, x, sizeof(float) * ctx.buf.x_stride,
                                        sizeof(float) * per_matrix, batch, cudaMemcpyDeviceToDevice, ctx.stream),
                      "copying the NS iterate");
}

// The two halves of a sharded step: `gram` computes the fp32 Gram matrices
// of the fp32 iterate in the output (matrices rows·cols apart) into
// buffers.grams; `iterate` runs the rest at the NS precision.
struct ShardContexts {
  ShardContexts(const NsShardBuffers& buffers, const MatrixBatchShape& shape, NsShardSplit split,
                const CudaNsConfig& config, CublasLtGemm& gemm, cudaStream_t stream)
      : geometry(shape, split),
        gram_config(config),
        gram_buffers(buffers.ns),
        gram{geometry, gram_buffers, gram_config, gemm, stream},
        iterate{geometry, buffers.ns, config, gemm, stream} {
    gram_config.bf16 = false;
    gram_buffers.gram = buffers.grams;
    gram_buffers.x_stride = shape.matrix_elements();
  }
  ShardContexts(const ShardContexts&) = delete;
  ShardContexts& operator=(const ShardContexts&) = delete;

  const Geometry geometry;
  CudaNsConfig gram_config;
  NsBuffers gram_buffers;
  const StepContext gram;
  const StepContext iterate;
};

// One sharded step: A summed over the ranks, then next = a·X + B·X, and out
// = fp32(next).
absl::Status ShardStep(const ShardContexts& ctx, const NsShardBuffers& buffers, const NsCoefficients& k,
                       NsAllReduce all_reduce, const void* x, void* next, float* out) {
  const int64_t gram_elements = int64_t{ctx.geometry.batch} * ctx.geometry.m * ctx.geometry.m;
  MUONSHARD_RETURN_IF_ERROR(FullGram(ctx.gram, out));
  MUONSHARD_RETURN_IF_ERROR(AllReduceAfter(ctx.iterate.stream, buffers.grams, gram_elements, all_reduce));
  if (ctx.iterate.config.bf16) {
    MUONSHARD_CUDA_RETURN_IF_ERROR(
        LaunchCastToBf16(buffers.grams, static_cast<Bf16Bits*>(buffers.ns.gram), gram_elements, ctx.iterate.stream),
        "rounding the summed Gram matrices");
  }
  MUONSHARD_RETURN_IF_ERROR(IterateWithGram(ctx.iterate, k, x, next));
  return PublishIterate(ctx.iterate, next, out);
}

}  // namespace

bool UseSymmetricPanels(const MatrixBatchShape& shape, SymmetricMatmul mode) {
  return mode == SymmetricMatmul::kAlways ||
         (mode == SymmetricMatmul::kAuto && std::min(shape.rows, shape.cols) >= kAutoSymmetricMinDim);
}

std::vector<int64_t> PanelBounds(int64_t m, int count) {
  std::vector<int64_t> bounds = {0};
  for (int i = 1; i < count; ++i) {
    const int64_t b = (i * m / count) / kAlignElements * kAlignElements;
    if (b > bounds.back()) bounds.push_back(b);
  }
  bounds.push_back(m);
  return bounds;
}

absl::StatusOr<CudaNsConfig> MakeCudaNsConfig(const NewtonSchulzOptions& options, const MatrixBatchShape& shape,
                                              bool bf16_by_default) {
  CudaNsConfig config;
  MUONSHARD_ASSIGN_OR_RETURN(config.coefficients, ResolveNsCoefficients(options));
  config.steps = options.steps;
  config.eps = options.eps;
  config.bf16 = options.precision == MatmulPrecision::kBf16 ||
                (options.precision == MatmulPrecision::kDefault && bf16_by_default);
  const int64_t m = std::min(shape.rows, shape.cols);
  const int count =
      UseSymmetricPanels(shape, options.symmetric) ? static_cast<int>(std::clamp<int64_t>(m / kPanelHeight, 2, 8)) : 1;
  config.panels = PanelBounds(m, count);
  return config;
}

size_t NsWorkspaceBytes(const MatrixBatchShape& shape, bool bf16, bool with_update) {
  const Strides strides = StridesFor(shape);
  const size_t es = bf16 ? 2 : 4;
  size_t bytes = RoundUpBytes(sizeof(double) * shape.batch);
  if (with_update) bytes += RoundUpBytes(sizeof(float) * shape.elements());
  bytes += 2 * RoundUpBytes(es * strides.x * shape.batch);
  bytes += 2 * RoundUpBytes(es * strides.gram * shape.batch);
  return bytes;
}

NsBuffers CarveNsBuffers(void* workspace, const MatrixBatchShape& shape, bool bf16, bool with_update) {
  const Strides strides = StridesFor(shape);
  const size_t es = bf16 ? 2 : 4;
  char* p = static_cast<char*>(workspace);
  auto take = [&p](size_t bytes) {
    char* region = p;
    p += RoundUpBytes(bytes);
    return region;
  };
  NsBuffers b;
  b.x_stride = strides.x;
  b.gram_stride = strides.gram;
  b.sums = reinterpret_cast<double*>(take(sizeof(double) * shape.batch));
  if (with_update) {
    b.update = reinterpret_cast<float*>(take(sizeof(float) * shape.elements()));
  }
  b.x = take(es * strides.x * shape.batch);
  b.y = take(es * strides.x * shape.batch);
  b.gram = take(es * strides.gram * shape.batch);
  b.poly = take(es * strides.gram * shape.batch);
  return b;
}

absl::StatusOr<CudaNsConfig> MakeCudaNsShardConfig(const NewtonSchulzOptions& options,
                                                   const MatrixBatchShape& shard_shape, NsShardSplit split,
                                                   bool bf16_by_default) {
  const int64_t m = NsShardGramSide(shard_shape, split);
  const MatrixBatchShape grams{shard_shape.batch, m, m};
  if (const absl::Status status = ValidateMatrixBatchShape(grams); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("NewtonSchulzShard: Gram matrices: ", status.message()));
  }
  return MakeCudaNsConfig(options, grams, bf16_by_default);
}

size_t NsShardWorkspaceBytes(const MatrixBatchShape& shard_shape, NsShardSplit split, bool bf16) {
  return LayOutShard(shard_shape, split, bf16).bytes;
}

NsShardBuffers CarveNsShardBuffers(void* workspace, const MatrixBatchShape& shard_shape, NsShardSplit split,
                                   bool bf16) {
  const ShardLayout layout = LayOutShard(shard_shape, split, bf16);
  const int64_t m = NsShardGramSide(shard_shape, split);
  char* base = static_cast<char*>(workspace);
  NsShardBuffers b;
  b.ns.sums = reinterpret_cast<double*>(base + layout.sums);
  b.ns.x = base + layout.x;
  b.ns.y = base + layout.y;
  b.ns.gram = base + layout.gram;
  b.ns.poly = base + layout.poly;
  b.ns.x_stride = RoundUp(shard_shape.matrix_elements(), kAlignElements);
  b.ns.gram_stride = m * m;
  b.norms = reinterpret_cast<float*>(base + layout.norms);
  b.grams = reinterpret_cast<float*>(base + layout.grams);
  return b;
}

absl::Status OrthogonalizeShardOnDevice(const float* in, float* out, const NsShardBuffers& buffers,
                                        const MatrixBatchShape& shard_shape, NsShardSplit split,
                                        const CudaNsConfig& config, CublasLtGemm& gemm, cudaStream_t stream,
                                        NsAllReduce all_reduce) {
  MUONSHARD_RETURN_IF_ERROR(NormalizeShard(in, buffers, shard_shape, config, stream, all_reduce));
  const ShardContexts ctx(buffers, shard_shape, split, config, gemm, stream);
  void* current = buffers.ns.x;
  void* next = buffers.ns.y;
  MUONSHARD_RETURN_IF_ERROR(PublishIterate(ctx.iterate, current, out));
  for (int step = 0; step < config.steps; ++step) {
    const NsCoefficients& k = config.coefficients[step % config.coefficients.size()];
    MUONSHARD_RETURN_IF_ERROR(ShardStep(ctx, buffers, k, all_reduce, current, next, out));
    std::swap(current, next);
  }
  return absl::OkStatus();
}

absl::StatusOr<const void*> OrthogonalizeOnDevice(const float* source, const NsBuffers& buffers,
                                                  const MatrixBatchShape& shape, const CudaNsConfig& config,
                                                  CublasLtGemm& gemm, cudaStream_t stream) {
  const cudaError_t normalized =
      config.bf16 ? LaunchNormalize(source, shape.batch, shape.matrix_elements(), buffers.sums, config.eps,
                                    buffers.x_stride, static_cast<Bf16Bits*>(buffers.x), stream)
                  : LaunchNormalize(source, shape.batch, shape.matrix_elements(), buffers.sums, config.eps,
                                    buffers.x_stride, static_cast<float*>(buffers.x), stream);
  MUONSHARD_CUDA_RETURN_IF_ERROR(normalized, "normalising the NS input");
  const Geometry geometry(shape);
  const StepContext ctx{geometry, buffers, config, gemm, stream};
  void* current = buffers.x;
  void* next = buffers.y;
  for (int step = 0; step < config.steps; ++step) {
    const NsCoefficients& k = config.coefficients[step % config.coefficients.size()];
    MUONSHARD_RETURN_IF_ERROR(Step(ctx, k, current, next));
    std::swap(current, next);
  }
  return static_cast<const void*>(current);
}

}  // namespace muonshard::kernels::internal
