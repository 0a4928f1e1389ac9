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
// Then the element-wise kernels the worker runs on the CPU backend, as the
// step simulator prices them (sim/plan_program.h: bytes per element over a
// memory rate, plus a cost per call; docs/simulator.md, "Compute"):
//   elementwise=adamw|muon elements=N bytes_per_element=B gb_s=X call_us=Y
// AdamW and Muon's momentum + apply over N fp32 elements, GB/s counted with
// the simulator's bytes per element, and the same kernels on 16 elements
// (their fixed cost per call); and one whole Muon update of an 8 x 8
// matrix, the fixed cost of a Newton–Schulz call (its FLOPs are nothing):
//   muon_call_us=Z
// Every kernel runs on the threads OpenBLAS reports (OPENBLAS_NUM_THREADS).
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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "common/flags.h"
#include "kernels/adamw.h"
#include "kernels/blas_core.h"
#include "kernels/kernel_backend.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "sim/plan_program.h"

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

void Check(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

// The worker's element-wise kernels on `n` fp32 elements, through the CPU
// backend (on the threads it was created with).
class ElementwiseRunner {
 public:
  ElementwiseRunner(KernelBackend& backend, int64_t n)
      : backend_(backend), n_(n), grad_(n, 0.01f), a_(n, 0.5f), b_(n, 0.25f), c_(n, 0.125f), update_(n) {}

  void Adamw() {
    float beta1_pow = 0.9f, beta2_pow = 0.95f;
    AdamWOptions options;
    options.lr = 1e-3f;
    options.advance_beta_pows = false;
    Check(
        backend_.AdamW({grad_.data(), a_.data(), b_.data(), c_.data(), nullptr}, n_, {&beta1_pow, &beta2_pow}, options),
        "AdamW");
  }

  // Momentum into the NS input, then the apply of an orthogonalised update
  // (the gradient stands in for it): Muon's two passes over every element.
  void Muon() {
    const MuonOptions options;
    Check(backend_.MuonMomentum(grad_.data(), a_.data(), update_.data(), n_, options), "MuonMomentum");
    Check(backend_.MuonApply(grad_.data(), b_.data(), nullptr, n_, {0.999f, 1e-3f}), "MuonApply");
  }

 private:
  KernelBackend& backend_;
  int64_t n_;
  std::vector<float> grad_, a_, b_, c_, update_;
};

void ReportElementwise(KernelBackend& backend, int reps) {
  constexpr int64_t kElements = int64_t{1} << 22;  // 4M: far outside the caches
  constexpr int64_t kSmall = 16;
  constexpr int kSmallCalls = 2000;
  ElementwiseRunner big(backend, kElements);
  ElementwiseRunner small(backend, kSmall);
  auto many = [](const std::function<void()>& fn) {
    return [fn] {
      for (int i = 0; i < kSmallCalls; ++i) fn();
    };
  };
  const std::vector<double> best = bench::BestSeconds(
      std::max(reps, 5),
      {[&] { big.Adamw(); }, [&] { big.Muon(); }, many([&] { small.Adamw(); }), many([&] { small.Muon(); })});
  const int64_t adamw_bytes = sim::AdamwBytesPerElement(v1::FP32, v1::FP32);
  const int64_t muon_bytes = sim::MuonBytesPerElement(v1::FP32, v1::FP32);
  // Muon's passes are two calls.
  std::printf("elementwise=adamw elements=%lld bytes_per_element=%lld gb_s=%.2f call_us=%.3f\n",
              static_cast<long long>(kElements), static_cast<long long>(adamw_bytes),
              kElements * adamw_bytes / best[0] / 1e9, best[2] / kSmallCalls * 1e6);
  std::printf("elementwise=muon elements=%lld bytes_per_element=%lld gb_s=%.2f call_us=%.3f\n",
              static_cast<long long>(kElements), static_cast<long long>(muon_bytes),
              kElements * muon_bytes / best[1] / 1e9, best[3] / kSmallCalls / 2 * 1e6);
}

// One whole Muon update (momentum, NS5, apply) of an 8 x 8 matrix: the fixed
// cost of a call.
void ReportMuonCall(KernelBackend& backend, int reps) {
  constexpr int kCalls = 2000;
  const MatrixBatchShape shape{1, 8, 8};
  std::vector<float> grad(shape.elements(), 0.01f), momentum(shape.elements()), master(shape.elements(), 0.5f);
  const MuonOptions options;
  const std::vector<double> best =
      bench::BestSeconds(std::max(reps, 5), {[&] {
                           for (int i = 0; i < kCalls; ++i) {
                             Check(backend.MuonUpdate({grad.data(), momentum.data(), master.data(), nullptr}, shape,
                                                      WeightLayout::kOutIn, options),
                                   "MuonUpdate");
                           }
                         }});
  std::printf("muon_call_us=%.3f\n", best[0] / kCalls * 1e6);
}

int Run(const Flags& flags) {
  // Every kernel on OpenBLAS's threads, the matrix loops of batched
  // Newton-Schulz too (as a worker's --blas-threads sets both): by default
  // those loops take every hardware thread, so a one-thread run would time
  // a batch on all of them.
  const std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend({openblas_get_num_threads()});
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
  ReportElementwise(*backend, flags.reps);
  ReportMuonCall(*backend, flags.reps);
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
