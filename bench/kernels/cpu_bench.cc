// muonshard-bench-kernels: CPU Newton–Schulz throughput against OpenBLAS
// sgemm measured in the same run.
//
// For each case it times NS5 (simple coefficients, fp32) with the symmetric
// (ssyrk/ssymm) and plain (sgemm) paths, and cblas_sgemm on the iteration's
// largest product (m x m times m x n, batch times). GFLOP/s counts full
// matmuls: steps·(4m²n + 2m³) per matrix, m <= n, whichever path ran. Each
// figure is the best of --reps rounds after a warm-up round; the three
// measurements of a case alternate within each round.
//
// The last stdout line is, for the 2048² case (256² with --quick):
//   ns_cpu_gflops=<x> sgemm_gflops=<y> ratio=<x/y>
//
// Usage: muonshard-bench-kernels [--quick] [--reps N] (--help)

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "common/flags.h"
#include "kernels/blas_core.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace {

struct BenchCase {
  std::string name;
  MatrixBatchShape shape;
  bool headline;  // The case reported on the last line.
};

struct Flags {
  bool quick = false;
  int reps = 2;
};

std::vector<BenchCase> Cases(bool quick) {
  if (quick) {
    return {
        {"128x512", {1, 128, 512}, false}, {"experts8x64x128", {8, 64, 128}, false}, {"256x256", {1, 256, 256}, true}};
  }
  return {{"1024x1024", {1, 1024, 1024}, false},
          {"4096x1024", {1, 4096, 1024}, false},
          // Qwen3-30B-A3B experts are 768 x 2048; 8 of its 128 per layer.
          {"experts8x768x2048", {8, 768, 2048}, false},
          // Many small experts: the one-thread-per-matrix path.
          {"experts64x128x512", {64, 128, 512}, false},
          // The shapes of the shaped-network benchmark's models (Qwen3-30B-A3B
          // and Llama-3.1-8B at /16), for the simulator's validation
          // (bench/sim/validate_shaped_net.py): its experts, attention and MLP.
          {"experts64x48x128", {64, 48, 128}, false},
          {"64x256", {1, 64, 256}, false},
          {"256x256", {1, 256, 256}, false},
          {"256x896", {1, 256, 896}, false},
          {"2048x2048", {1, 2048, 2048}, true}};
}

// Buffers and closures for one case: sgemm on the NS iteration's B·X product
// (m x m times m x n, batch times), and NS5 with symmetric and plain matmuls.
class CaseRunner {
 public:
  explicit CaseRunner(const MatrixBatchShape& shape)
      : shape_(shape),
        m_(static_cast<int>(std::min(shape.rows, shape.cols))),
        n_(static_cast<int>(std::max(shape.rows, shape.cols))),
        gemm_a_(int64_t{m_} * m_, 0.01f),
        gemm_b_(int64_t{m_} * n_, 0.02f),
        gemm_c_(int64_t{m_} * n_),
        in_(shape.elements()),
        out_(shape.elements()) {
    for (size_t i = 0; i < in_.size(); ++i) {
      in_[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    }
  }

  void Sgemm() {
    for (int64_t e = 0; e < shape_.batch; ++e) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m_, n_, m_, 1.0f, gemm_a_.data(), m_, gemm_b_.data(), n_,
                  0.0f, gemm_c_.data(), n_);
    }
  }
  double SgemmFlops() const { return 2.0 * m_ * m_ * n_ * shape_.batch; }

  void Ns(SymmetricMatmul symmetric) {
    NewtonSchulzOptions options;
    options.precision = MatmulPrecision::kFp32;
    options.symmetric = symmetric;
    const absl::Status status = NewtonSchulzCpu(in_.data(), out_.data(), shape_, options);
    if (!status.ok()) {
      std::fprintf(stderr, "NewtonSchulzCpu: %s\n", status.ToString().c_str());
      std::exit(1);
    }
  }
  double NsFlops() const { return NewtonSchulzFlops(shape_, /*steps=*/5); }

 private:
  MatrixBatchShape shape_;
  int m_, n_;
  std::vector<float> gemm_a_, gemm_b_, gemm_c_, in_, out_;
};

int Run(const Flags& flags) {
  std::printf(
      "# muonshard-bench-kernels: CPU NS5 (fp32, simple) vs sgemm, "
      "OpenBLAS %s, %d threads, best of %d\n",
      openblas_get_corename(), openblas_get_num_threads(), flags.reps);
  if (const std::string advice = BlasCoreAdvice(); !advice.empty()) std::printf("# warning: %s\n", advice.c_str());
  double headline_ns = 0, headline_sgemm = 0;
  for (const BenchCase& c : Cases(flags.quick)) {
    CaseRunner runner(c.shape);
    const std::vector<double> best =
        bench::BestSeconds(flags.reps, {[&] { runner.Sgemm(); }, [&] { runner.Ns(SymmetricMatmul::kAlways); },
                                        [&] { runner.Ns(SymmetricMatmul::kNever); }});
    const double sgemm = runner.SgemmFlops() / best[0] / 1e9;
    const double symmetric = runner.NsFlops() / best[1] / 1e9;
    const double plain = runner.NsFlops() / best[2] / 1e9;
    std::printf(
        "case=%s batch=%lld rows=%lld cols=%lld sgemm_gflops=%.1f "
        "ns_symmetric_gflops=%.1f ns_plain_gflops=%.1f "
        "ratio_symmetric=%.2f ratio_plain=%.2f\n",
        c.name.c_str(), static_cast<long long>(c.shape.batch), static_cast<long long>(c.shape.rows),
        static_cast<long long>(c.shape.cols), sgemm, symmetric, plain, symmetric / sgemm, plain / sgemm);
    std::fflush(stdout);
    if (c.headline) {
      // The default options (SymmetricMatmul::kAuto) take the symmetric path.
      headline_ns = symmetric;
      headline_sgemm = sgemm;
    }
  }
  std::printf("ns_cpu_gflops=%.1f sgemm_gflops=%.1f ratio=%.3f\n", headline_ns, headline_sgemm,
              headline_ns / headline_sgemm);
  return 0;
}

}  // namespace
}  // namespace muonshard::kernels

int main(int argc, char** argv) {
  muonshard::kernels::Flags flags;
  muonshard::FlagSet set("usage: muonshard-bench-kernels [--quick] [--reps N]");
  set.Bool("quick", &flags.quick, "small shapes: a smoke test of the output");
  set.Int("reps", &flags.reps, "timed rounds per case (the best of them) after one warm-up round");
  if (std::optional<int> exit = muonshard::kernels::bench::ParseBenchFlags(set, argc, argv, {{"reps", &flags.reps}})) {
    return *exit;
  }
  return muonshard::kernels::Run(flags);
}
