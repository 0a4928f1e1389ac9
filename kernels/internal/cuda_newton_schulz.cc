#include "kernels/internal/cuda_newton_schulz.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

absl::Status Step(const StepContext& ctx, const NsCoefficients& k, const void* x, void* next) {
  MUONSHARD_RETURN_IF_ERROR(Gram(ctx, x));
  if (ctx.config.symmetric()) MUONSHARD_RETURN_IF_ERROR(Mirror(ctx, ctx.buf.gram));
  MUONSHARD_RETURN_IF_ERROR(Polynomial(ctx, k));
  if (ctx.config.symmetric()) MUONSHARD_RETURN_IF_ERROR(Mirror(ctx, ctx.buf.poly));
  return Update(ctx, k.a, x, next);
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
