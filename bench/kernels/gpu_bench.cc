// muonshard-bench-kernels-gpu: CUDA Newton–Schulz (NS5, bf16, simple
// coefficients) against the cuBLAS bf16 GEMM rate measured in the same run.
//
// For each case it times CudaKernelBackend::NewtonSchulz with plain and with
// symmetric (panel) GEMMs, and cublasGemmStridedBatchedEx (bf16 in/out, fp32
// compute) on the iteration's largest product, B·X: m x m times m x n, batch
// times. TFLOP/s counts full matmuls, batch·steps·(4m²n + 2m³) with m <= n,
// whichever path ran, so the symmetric path can exceed the GEMM rate. Times
// are CUDA-event means over --reps calls after two warm-ups; the NS time
// includes the normalisation and the fp32 output.
//
// The last line is, for the last case (the largest square; with --quick the
// expert stack), with the path SymmetricMatmul::kAuto takes there:
//   ns_gpu_tflops=<x> gemm_tflops=<y> ratio=<x/y> auto=<plain|symmetric>
//
// Usage: muonshard-bench-kernels-gpu [--quick] [--reps N] (--help)

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/kernels/bench_util.h"
#include "common/flags.h"
#include "kernels/cuda_kernel_backend.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace {

void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

void Check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", what, cublasGetStatusString(status));
    std::exit(1);
  }
}

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

struct Flags {
  bool quick = false;
  int reps = 10;
};

struct BenchCase {
  std::string name;
  MatrixBatchShape shape;
};

std::vector<BenchCase> Cases(bool quick) {
  if (quick) return {{"512x512", {1, 512, 512}}, {"experts8x256x512", {8, 256, 512}}};
  return {{"1024x1024", {1, 1024, 1024}},
          {"2048x2048", {1, 2048, 2048}},
          {"4096x4096", {1, 4096, 4096}},
          // Llama-3.1-8B MLP [14336, 4096] and attention-sized rectangles.
          {"14336x4096", {1, 14336, 4096}},
          {"4096x1024", {1, 4096, 1024}},
          {"2048x8192", {1, 2048, 8192}},
          // Qwen3-30B-A3B experts are 768 x 2048 (64 of 128 per layer).
          {"experts64x768x2048", {64, 768, 2048}},
          // Issue 34's other expert stacks: 128 x 1408 x 2048, and Kimi-K2's
          // 384 experts of 2048 x 7168 as one EP-16 rank's shard (24 of them).
          {"experts128x1408x2048", {128, 1408, 2048}},
          {"experts24x2048x7168", {24, 2048, 7168}},
          {"8192x8192", {1, 8192, 8192}}};
}

// Device buffer for the bench (cudaMalloc/cudaFree).
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) {
    Check(cudaMalloc(&data_, bytes), "cudaMalloc");
    Check(cudaMemset(data_, 0, bytes), "cudaMemset");
  }
  ~DeviceMemory() { cudaFree(data_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

// Mean milliseconds of `fn` over `reps` calls on `stream`, after 2 warm-ups.
template <typename Fn>
double MeanMs(cudaStream_t stream, int reps, const Fn& fn) {
  fn();
  fn();
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  Check(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int r = 0; r < reps; ++r) fn();
  Check(cudaEventRecord(stop, stream), "cudaEventRecord");
  Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / reps;
}

// Random-ish fp32 input: a fixed pattern in [-0.5, 0.5).
void FillInput(float* device, int64_t n) {
  std::vector<float> host(n);
  for (int64_t i = 0; i < n; ++i) {
    host[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  }
  Check(cudaMemcpy(device, host.data(), sizeof(float) * n, cudaMemcpyHostToDevice), "cudaMemcpy");
}

double GemmTflops(cublasHandle_t handle, cudaStream_t stream, const MatrixBatchShape& shape, int reps) {
  const int m = static_cast<int>(std::min(shape.rows, shape.cols));
  const int n = static_cast<int>(std::max(shape.rows, shape.cols));
  const int batch = static_cast<int>(shape.batch);
  DeviceMemory a(size_t{2} * m * m * batch), b(size_t{2} * m * n * batch), c(size_t{2} * m * n * batch);
  Check(cublasSetStream(handle, stream), "cublasSetStream");
  const float alpha = 1.0f, beta = 0.0f;
  const double ms = MeanMs(stream, reps, [&] {
    Check(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, m, &alpha, a.get(), CUDA_R_16BF, m,
                                     int64_t{m} * m, b.get(), CUDA_R_16BF, m, int64_t{m} * n, &beta, c.get(),
                                     CUDA_R_16BF, m, int64_t{m} * n, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  });
  return 2.0 * m * m * n * batch / (ms * 1e-3) / 1e12;
}

double NsTflops(CudaKernelBackend& backend, const MatrixBatchShape& shape, SymmetricMatmul symmetric, int reps) {
  DeviceMemory in(sizeof(float) * shape.elements()), out(sizeof(float) * shape.elements());
  FillInput(static_cast<float*>(in.get()), shape.elements());
  NewtonSchulzOptions options;
  options.precision = MatmulPrecision::kBf16;
  options.symmetric = symmetric;
  const double ms = MeanMs(backend.stream(), reps, [&] {
    Check(backend.NewtonSchulz(static_cast<const float*>(in.get()), static_cast<float*>(out.get()), shape, options),
          "NewtonSchulz");
  });
  Check(backend.Synchronize(), "Synchronize");
  return NewtonSchulzFlops(shape, options.steps) / (ms * 1e-3) / 1e12;
}

int Run(const Flags& flags) {
  absl::StatusOr<std::unique_ptr<CudaKernelBackend>> backend = CudaKernelBackend::Create(0);
  Check(backend.status(), "creating the CUDA backend");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cublasHandle_t handle = nullptr;
  Check(cublasCreate(&handle), "cublasCreate");
  std::printf(
      "# muonshard-bench-kernels-gpu: NS5 bf16 (simple) vs cuBLAS bf16 "
      "GEMM on %s, mean of %d calls\n",
      prop.name, flags.reps);
  double last_ns = 0, last_gemm = 0;
  bool last_symmetric = false;
  for (const BenchCase& c : Cases(flags.quick)) {
    const double gemm = GemmTflops(handle, (*backend)->stream(), c.shape, flags.reps);
    const double plain = NsTflops(**backend, c.shape, SymmetricMatmul::kNever, flags.reps);
    const double symmetric = NsTflops(**backend, c.shape, SymmetricMatmul::kAlways, flags.reps);
    const bool auto_symmetric = CudaKernelBackend::UsesSymmetricMatmul(c.shape, SymmetricMatmul::kAuto);
    std::printf(
        "case=%s batch=%lld rows=%lld cols=%lld gemm_tflops=%.1f "
        "ns_plain_tflops=%.1f ns_symmetric_tflops=%.1f ratio_plain=%.3f "
        "ratio_symmetric=%.3f auto=%s\n",
        c.name.c_str(), static_cast<long long>(c.shape.batch), static_cast<long long>(c.shape.rows),
        static_cast<long long>(c.shape.cols), gemm, plain, symmetric, plain / gemm, symmetric / gemm,
        auto_symmetric ? "symmetric" : "plain");
    std::fflush(stdout);
    last_ns = auto_symmetric ? symmetric : plain;
    last_gemm = gemm;
    last_symmetric = auto_symmetric;
  }
  cublasDestroy(handle);
  std::printf("ns_gpu_tflops=%.1f gemm_tflops=%.1f ratio=%.3f auto=%s\n", last_ns, last_gemm, last_ns / last_gemm,
              last_symmetric ? "symmetric" : "plain");
  return 0;
}

}  // namespace
}  // namespace muonshard::kernels

int main(int argc, char** argv) {
  muonshard::kernels::Flags flags;
  muonshard::FlagSet set("usage: muonshard-bench-kernels-gpu [--quick] [--reps N]");
  set.Bool("quick", &flags.quick, "small shapes: a smoke test of the output");
  set.Int("reps", &flags.reps, "timed repetitions per case");
  if (std::optional<int> exit = muonshard::kernels::bench::ParseBenchFlags(set, argc, argv, {{"reps", &flags.reps}})) {
    return *exit;
  }
  return muonshard::kernels::Run(flags);
}
