// Plan time on a Kimi-K2-size MoE manifest (~71k tensors) at 1,024 ranks with
// ep 64, per policy. `--dump-manifest FILE` writes the manifest as JSON first,
// so bench/planner/seed_python.py can time the same rules in Python.
#include <cstring>
#include <iostream>
#include <string>

#include "benchmark/benchmark.h"
#include "common/file_util.h"
#include "common/proto_json.h"
#include "plan/model.h"
#include "plan/planner.h"
#include "plan/topology.h"
#include "tests/testing/manifest_builder.h"

namespace muonshard {
namespace {

const v1::ModelManifest& Manifest() {
  static const v1::ModelManifest* const m = new v1::ModelManifest(testing::LargeMoeManifest());
  return *m;
}

void BM_Plan(benchmark::State& state, v1::Policy policy) {
  const int world = static_cast<int>(state.range(0));
  const int ep = static_cast<int>(state.range(1));
  v1::PlanRequest request = testing::MakeRequest(Manifest(), world, 1, ep, policy);
  for (auto _ : state) {
    auto plan = planner::ComputePlan(request);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(plan->ranks_size());
  }
  state.counters["tensors"] = Manifest().tensors_size();
}

// As the coordinator computes plans: on an arena sized for the plan.
void BM_PlanArena(benchmark::State& state, v1::Policy policy) {
  const int world = static_cast<int>(state.range(0));
  const int ep = static_cast<int>(state.range(1));
  v1::PlanRequest request = testing::MakeRequest(Manifest(), world, 1, ep, policy);
  uint64_t arena_bytes = 0;
  for (auto _ : state) {
    google::protobuf::Arena arena(planner::PlanArenaOptions());
    auto plan = planner::ComputePlan(request, &arena);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize((*plan)->ranks_size());
    arena_bytes = arena.SpaceUsed();
  }
  state.counters["tensors"] = Manifest().tensors_size();
  state.counters["plan_mb"] = static_cast<double>(arena_bytes) / 1e6;
}

// Phases, to see where plan time goes.
void BM_ResolveModel(benchmark::State& state) {
  auto layout = planner::RankLayout::Create(testing::MakeRequest(Manifest(), 1024, 1, 64).topology());
  for (auto _ : state) {
    auto model = planner::ResolveModel(Manifest(), *layout, planner::DefaultExcludePatterns());
    benchmark::DoNotOptimize(model->units.size());
  }
}
BENCHMARK(BM_ResolveModel)->Unit(benchmark::kMillisecond);

void BM_ContentHash(benchmark::State& state) {
  auto canonical = planner::CanonicalizeRequest(testing::MakeRequest(Manifest(), 1024, 1, 64));
  for (auto _ : state) benchmark::DoNotOptimize(planner::ContentHash(*canonical));
}
BENCHMARK(BM_ContentHash)->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(BM_PlanArena, seed, v1::SEED)->Args({1024, 64})->Args({256, 8})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PlanArena, balanced, v1::BALANCED)
    ->Args({1024, 64})
    ->Args({1024, 8})
    ->Args({256, 8})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Plan, seed, v1::SEED)->Args({1024, 64})->Args({256, 8})->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Plan, seed_all, v1::SEED_ALL)->Args({1024, 64})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace muonshard

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--dump-manifest") == 0) {
      auto json = muonshard::ToJson(muonshard::Manifest(), /*pretty=*/false);
      absl::Status s = json.ok() ? muonshard::WriteFileAtomic(argv[i + 1], *json) : json.status();
      if (!s.ok()) {
        std::cerr << s << "\n";
        return 1;
      }
      std::cerr << "wrote " << argv[i + 1] << "\n";
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
