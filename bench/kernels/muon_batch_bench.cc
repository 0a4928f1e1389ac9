// muonshard-bench-muon-batch: a rank owning many expert matrices of one
// shape, each 2-D tensor in its own allocations (as in HF checkpoints), with
// the CPU backend: one MuonUpdate call per matrix against one
// MuonUpdateBatch over the same matrices.
//
// Both variants update the same buffers (bf16 model copy included, default
// MuonOptions: fp32 NS5, symmetric BLAS), alternating within each round
// after a warm-up round; each figure is the median over --reps rounds. A
// sample repeats its variant enough times to last >= 0.2 s (at least once).
// GFLOP/s count the Newton–Schulz matmuls only, as full matmuls
// (NewtonSchulzFlops: steps·(4m²n + 2m³) per matrix); the elementwise
// momentum/apply passes are timed but not counted. Each case also reports
// the process CPU time per call (all threads, OpenBLAS's spinning included):
// on a shared machine the wall times follow the scheduler, the CPU times
// show the work each variant costs.
//
// Shapes: Qwen3-30B-A3B experts (moe_intermediate 768 x hidden 2048) scaled
// down by 16 (48x128, 128x48) and by 4 (192x512, 512x192); --full adds the
// full 768x2048 (threaded-BLAS path, ~1 min per round for 64 matrices).
//
// The last stdout line is, for 48x128:
//   muon_batch_gflops=<x> per_matrix_gflops=<y> ratio=<x/y>
//
// Usage: muonshard-bench-muon-batch [--quick] [--full] [--reps N] [--matrices N] (--help)
//                                   [--matrices=N]

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "bench/kernels/bench_util.h"
#include "common/flags.h"
#include "kernels/bf16.h"
#include "kernels/blas_core.h"
#include "kernels/kernel_backend.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace {

struct Flags {
  bool quick = false;
  bool full = false;
  int reps = 7;
  int matrices = 64;
};

struct BenchCase {
  int64_t rows;
  int64_t cols;
  bool headline;  // The case reported on the last line.
};

std::vector<BenchCase> Cases(const Flags& flags) {
  if (flags.quick) return {{128, 48, false}, {48, 128, true}};
  std::vector<BenchCase> cases = {{128, 48, false}, {192, 512, false}, {512, 192, false}};
  if (flags.full) cases.push_back({768, 2048, false});
  cases.push_back({48, 128, true});
  return cases;
}

// One expert matrix's Muon buffers, in allocations of their own.
struct Expert {
  std::vector<float> grad, momentum, master;
  std::vector<Bf16Bits> model;
};

void Fill(std::vector<float>& v, uint32_t seed, float scale) {
  for (size_t i = 0; i < v.size(); ++i) {
    const uint32_t h = static_cast<uint32_t>(i) * 2654435761u + seed * 40503u;
    v[i] = scale * (static_cast<float>(h % 1000) / 500.0f - 1.0f);
  }
}

std::vector<std::unique_ptr<Expert>> MakeExperts(int count, int64_t n) {
  std::vector<std::unique_ptr<Expert>> experts;
  for (int i = 0; i < count; ++i) {
    auto e = std::make_unique<Expert>();
    e->grad.resize(n);
    e->momentum.resize(n);
    e->master.resize(n);
    e->model.resize(n);
    Fill(e->grad, 3 * i, 0.01f);
    Fill(e->momentum, 3 * i + 1, 0.01f);
    Fill(e->master, 3 * i + 2, 0.05f);
    experts.push_back(std::move(e));
  }
  return experts;
}

void CheckOk(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall and process CPU seconds per call of `fn`, over `times` calls.
struct Sample {
  double wall;
  double cpu;
};

Sample Time(const std::function<void()>& fn, int times) {
  const double cpu_start = ProcessCpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < times; ++i) fn();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return {elapsed.count() / times, (ProcessCpuSeconds() - cpu_start) / times};
}

double LoadAverage() {
  double load[1] = {-1};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

struct Result {
  double per_matrix_gflops;
  double batched_gflops;
};

Result RunCase(KernelBackend& backend, const BenchCase& c, const Flags& flags) {
  const MatrixBatchShape shape{1, c.rows, c.cols};
  const std::vector<std::unique_ptr<Expert>> experts = MakeExperts(flags.matrices, shape.elements());
  std::vector<MuonTensors> items;
  for (const auto& e : experts) {
    items.push_back({e->grad.data(), e->momentum.data(), e->master.data(), e->model.data()});
  }
  const MuonOptions options;
  const std::function<void()> per_matrix = [&] {
    for (const MuonTensors& t : items) {
      CheckOk(backend.MuonUpdate(t, shape, WeightLayout::kOutIn, options), "MuonUpdate");
    }
  };
  const std::function<void()> batched = [&] {
    CheckOk(backend.MuonUpdateBatch(items, shape, WeightLayout::kOutIn, options), "MuonUpdateBatch");
  };
  // Warm-up round, which also sizes the samples.
  const double warm = std::min(Time(per_matrix, 1).wall, Time(batched, 1).wall);
  const int times = std::max(1, static_cast<int>(std::ceil(0.2 / warm)));
  std::vector<double> per_matrix_wall, batched_wall, per_matrix_cpu, batched_cpu;
  const auto sample = [&](bool is_batched) {
    const Sample s = Time(is_batched ? batched : per_matrix, times);
    (is_batched ? batched_wall : per_matrix_wall).push_back(s.wall);
    (is_batched ? batched_cpu : per_matrix_cpu).push_back(s.cpu);
  };
  for (int r = 0; r < flags.reps; ++r) {
    // Alternate which variant goes first, so neither always follows the
    // other's cache state.
    sample(r % 2 == 1);
    sample(r % 2 == 0);
  }
  const double flops = NewtonSchulzFlops({flags.matrices, shape.rows, shape.cols}, options.ns.steps);
  const double per_matrix_s = bench::Median(per_matrix_wall);
  const double batched_s = bench::Median(batched_wall);
  const Result result{flops / per_matrix_s / 1e9, flops / batched_s / 1e9};
  std::printf(
      "case=%lldx%lld matrices=%d per_matrix_ms=%.3f batched_ms=%.3f "
      "per_matrix_gflops=%.1f batched_gflops=%.1f ratio=%.2f "
      "per_matrix_cpu_ms=%.3f batched_cpu_ms=%.3f samples=%d "
      "calls_per_sample=%d load=%.2f\n",
      static_cast<long long>(shape.rows), static_cast<long long>(shape.cols), flags.matrices, per_matrix_s * 1e3,
      batched_s * 1e3, result.per_matrix_gflops, result.batched_gflops,
      result.batched_gflops / result.per_matrix_gflops, bench::Median(per_matrix_cpu) * 1e3,
      bench::Median(batched_cpu) * 1e3, flags.reps, times, LoadAverage());
  std::fflush(stdout);
  return result;
}

int Run(Flags flags) {
  if (flags.quick) flags.reps = std::min(flags.reps, 3);
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  std::printf(
      "# muonshard-bench-muon-batch: CPU MuonUpdate per matrix vs "
      "MuonUpdateBatch, OpenBLAS %s, %d BLAS threads, %u hardware threads, "
      "median of %d, load average %.2f\n",
      openblas_get_corename(), openblas_get_num_threads(), std::thread::hardware_concurrency(), flags.reps,
      LoadAverage());
  if (const std::string advice = BlasCoreAdvice(); !advice.empty()) std::printf("# warning: %s\n", advice.c_str());
  Result headline{0, 0};
  for (const BenchCase& c : Cases(flags)) {
    const Result r = RunCase(*backend, c, flags);
    if (c.headline) headline = r;
  }
  std::printf("muon_batch_gflops=%.1f per_matrix_gflops=%.1f ratio=%.3f\n", headline.batched_gflops,
              headline.per_matrix_gflops, headline.batched_gflops / headline.per_matrix_gflops);
  return 0;
}

}  // namespace
}  // namespace muonshard::kernels

int main(int argc, char** argv) {
  muonshard::kernels::Flags flags;
  muonshard::FlagSet set("usage: muonshard-bench-muon-batch [--quick] [--full] [--reps N] [--matrices N]");
  set.Bool("quick", &flags.quick, "small shapes: a smoke test of the output");
  set.Bool("full", &flags.full, "add the full 768x2048 case (threaded-BLAS path, ~1 min per round)");
  set.Int("reps", &flags.reps, "timed rounds per case (the median)");
  set.Int("matrices", &flags.matrices, "expert matrices per batch");
  if (std::optional<int> exit = muonshard::kernels::bench::ParseBenchFlags(
          set, argc, argv, {{"reps", &flags.reps}, {"matrices", &flags.matrices}})) {
    return *exit;
  }
  return muonshard::kernels::Run(flags);
}
