// muonshard-bench-blocked-ns: per-block Newton–Schulz (BlockedNewtonSchulz,
// kernels/blocked_newton_schulz.h) against Newton–Schulz of the whole fused
// matrix, on the CPU backend, for the fused weights of docs/benchmarks.md:
//
//   phi3-qkv       Phi-3-mini qkv_proj      [9216, 3072]     rows:3072,3072,3072
//   phi3-gate-up   Phi-3-mini gate_up_proj  [16384, 3072]    rows:8192,8192
//   gptoss-experts gpt-oss-20b experts gate_up_proj [32, 2880, 5760] cols:stride2
//
// Every dimension (the expert count included) is divided by --scale
// (default 4; 1 is the real size, minutes per case on a few cores). Default
// NewtonSchulzOptions (fp32 on the CPU, 5 simple steps). Each figure is the
// median of --reps calls after one warm-up call; GFLOP counts full matmuls
// (NewtonSchulzFlops) of the whole matrix and of the blocks. The per-block
// time includes the gathers and scatters (Copy2D) and the scratch.
//
// The last stdout line is, for the first case:
//   blocked_ns_s=<x> whole_ns_s=<y> ratio=<x/y>
//
// Usage: muonshard-bench-blocked-ns [--quick] [--scale N] [--reps N] (--help)

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/kernels/bench_util.h"
#include "common/flags.h"
#include "kernels/blocked_newton_schulz.h"
#include "kernels/kernel_backend.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace {

struct Flags {
  bool quick = false;
  int scale = 4;
  int reps = 3;
};

struct BenchCase {
  std::string name;
  MatrixBatchShape shape;
  NsBlockSpec blocks;
};

NsBlockSpec Concat(NsBlockAxis axis, const std::vector<int64_t>& sizes) {
  NsBlockSpec spec{axis, {}};
  int64_t at = 0;
  for (int64_t s : sizes) {
    spec.blocks.push_back({at, s, 1});
    at += s;
  }
  return spec;
}

std::vector<BenchCase> Cases(const Flags& flags) {
  const int64_t d = flags.quick ? 64 : flags.scale;
  const int64_t experts = std::max<int64_t>(1, 32 / d);
  return {
      {"phi3-qkv", {1, 9216 / d, 3072 / d}, Concat(NsBlockAxis::kRows, {3072 / d, 3072 / d, 3072 / d})},
      {"phi3-gate-up", {1, 16384 / d, 3072 / d}, Concat(NsBlockAxis::kRows, {8192 / d, 8192 / d})},
      {"gptoss-experts", {experts, 2880 / d, 5760 / d}, {NsBlockAxis::kCols, {{0, 2880 / d, 2}, {1, 2880 / d, 2}}}},
  };
}

double BlockedFlops(const BenchCase& c, int steps) {
  double flops = 0;
  for (const NsBlock& b : c.blocks.blocks) {
    const MatrixBatchShape s = c.blocks.axis == NsBlockAxis::kRows
                                   ? MatrixBatchShape{c.shape.batch, b.length, c.shape.cols}
                                   : MatrixBatchShape{c.shape.batch, c.shape.rows, b.length};
    flops += NewtonSchulzFlops(s, steps);
  }
  return flops;
}

int Run(const Flags& flags) {
  std::unique_ptr<KernelBackend> backend = CreateCpuKernelBackend();
  const NewtonSchulzOptions ns;
  double first_blocked = 0, first_whole = 0;
  std::printf("%-15s %-18s %-14s %10s %10s %10s %10s %7s\n", "case", "shape", "blocks", "whole_s", "blocked_s",
              "whole_GF", "blocked_GF", "ratio");
  for (const BenchCase& c : Cases(flags)) {
    std::vector<float> in(c.shape.elements());
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    std::vector<float> out(in.size());
    absl::Status status;
    const double whole = bench::MedianSeconds(flags.reps, [&] {
      if (status.ok()) status = backend->NewtonSchulz(in.data(), out.data(), c.shape, ns);
    });
    const double blocked = bench::MedianSeconds(flags.reps, [&] {
      if (status.ok()) status = BlockedNewtonSchulz(*backend, in.data(), out.data(), c.shape, c.blocks, ns);
    });
    if (!status.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), std::string(status.message()).c_str());
      return 1;
    }
    const std::string shape = absl::StrCat(c.shape.batch, "x", c.shape.rows, "x", c.shape.cols);
    const std::string blocks =
        absl::StrCat(c.blocks.blocks.size(), c.blocks.axis == NsBlockAxis::kRows ? " rows" : " cols",
                     c.blocks.blocks[0].step > 1 ? " strided" : "");
    std::printf("%-15s %-18s %-14s %10.3f %10.3f %10.1f %10.1f %7.2f\n", c.name.c_str(), shape.c_str(), blocks.c_str(),
                whole, blocked, NewtonSchulzFlops(c.shape, ns.steps) / 1e9, BlockedFlops(c, ns.steps) / 1e9,
                blocked / whole);
    if (first_whole == 0) {
      first_whole = whole;
      first_blocked = blocked;
    }
  }
  std::printf("blocked_ns_s=%.4f whole_ns_s=%.4f ratio=%.3f\n", first_blocked, first_whole,
              first_blocked / first_whole);
  return 0;
}

}  // namespace
}  // namespace muonshard::kernels

int main(int argc, char** argv) {
  muonshard::kernels::Flags flags;
  muonshard::FlagSet set("usage: muonshard-bench-blocked-ns [--quick] [--scale N] [--reps N]");
  set.Bool("quick", &flags.quick, "tiny shapes (every dimension / 64): a smoke test of the output");
  set.Int("scale", &flags.scale, "divide every dimension (the expert count included) by this");
  set.Int("reps", &flags.reps, "timed calls per figure (the median) after one warm-up call");
  if (std::optional<int> exit = muonshard::kernels::bench::ParseBenchFlags(
          set, argc, argv, {{"scale", &flags.scale}, {"reps", &flags.reps}})) {
    return *exit;
  }
  return muonshard::kernels::Run(flags);
}
