// The balanced policy with tp on real models (`bench/planner/tp_grid.sh`,
// docs/benchmarks.md): the importer's manifests, marked as Megatron splits
// them, planned at W 256, where a replica holds few matrices.
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "importer/hf_import.h"
#include "importer/tp_split.h"
#include "plan/model.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"
#include "tests/importer/import_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::importer {
namespace {

using testing::ReadConfig;

absl::StatusOr<v1::Plan> BalancedTpPlan(absl::string_view model, int world, int ep, int tp) {
  absl::StatusOr<std::string> json = ReadConfig(model);
  if (!json.ok()) return json.status();
  absl::StatusOr<v1::ModelManifest> manifest = ImportHfConfig(*json, {});
  if (!manifest.ok()) return manifest.status();
  TpSplitOptions split;
  split.tp = tp;
  if (absl::Status s = MarkTensorParallel(split, &*manifest); !s.ok()) return s;
  v1::PlanRequest request;
  *request.mutable_manifest() = *std::move(manifest);
  request.mutable_topology()->set_world_size(world);
  request.mutable_topology()->set_ep(ep);
  request.mutable_topology()->set_tp(tp);
  request.mutable_policy()->set_policy(v1::BALANCED);
  return planner::ComputePlan(request);
}

// ERNIE-4.5's ranks with ~20 small experts and a whole dense matrix's
// Newton-Schulz were at bytes/FLOPs 1.062/1.048 (tp 2) to 1.034/1.062
// (tp 8) while every dense replica held shards of ~1.5 matrices: each tp
// rank lost an expert's room to shard bytes whose FLOPs ran on a sibling.
// Gathered dense matrices placed in runs of tp (BalancedOptions.dense_runs)
// put the bytes where the FLOPs are. gpt-oss-20b's bytes were at 1.037,
// OLMoE's at 1.076 (and its FLOPs at 1.197 with tp 4 and 8, from the pair
// re-split that ignored the preload).
//
// gpt-oss-20b's FLOPs are judged against the best plan there is, which the
// lower bound (the mean) does not see. Its expert gate_up is orthogonalised
// per half (ns_blocks cols stride 2: two 2880 x 2880 blocks, 2 units of
// u = NsFlops(2880, 2880)) and down is 1 unit, so each moe_sharding group
// of 32 ranks holds 96 x 2 + 96 x 1 = 288 units, 9 per rank, in whole
// units; q and o (1.28 u each, 48 of them, whole on one tp rank) sit on top
// of some ranks. A rank with one has 10.28 u with 9 expert units, and with 8
// it leaves an extra unit on another rank of its group: the best plan's
// busiest rank has 10 u = 1.0817 x the mean (9.2445 u). The planner finds
// it.
TEST(TpBalanceTest, ExpertParallelModelsAtW256Ep8AreWithin105OfTheLowerBound) {
  for (const char* model : {"ERNIE-4.5-21B-A3B-PT", "gpt-oss-20b", "OLMoE-1B-7B-0924"}) {
    for (int tp : {2, 4, 8}) {
      SCOPED_TRACE(absl::StrCat(model, " tp ", tp));
      MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BalancedTpPlan(model, 256, 8, tp));
      MUONSHARD_EXPECT_OK(planner::ValidatePlan(plan));
      EXPECT_LE(plan.stats().max_over_lb_state_bytes(), 1.05);
      if (std::string(model) == "gpt-oss-20b") {
        const double unit = planner::NsFlops(2880, 2880, plan.policy().ns_steps());
        EXPECT_LE(plan.stats().max_ns_flops(), 1.05 * 10 * unit);
      } else {
        EXPECT_LE(plan.stats().max_over_lb_ns_flops(), 1.05);
      }
    }
  }
}

// Experts whole and replicated over the tp ranks (ep 1): every tp rank of a
// replica orthogonalises the replica's experts, one of them each split
// matrix. Placed one by one, a replica holding one of ERNIE-4.5's first-layer
// MLP matrices (11 experts' NS) put it on one tp rank on top of the
// replica's experts: FLOPs 1.050 / 1.076 / 1.063 at tp 2 / 4 / 8. In runs of
// tp every tp rank of such a replica gets one.
TEST(TpBalanceTest, ExpertsReplicatedOverTpAtW256Ep1AreWithin105OfTheLowerBound) {
  for (int tp : {2, 4, 8}) {
    SCOPED_TRACE(absl::StrCat("tp ", tp));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BalancedTpPlan("ERNIE-4.5-21B-A3B-PT", 256, 1, tp));
    MUONSHARD_EXPECT_OK(planner::ValidatePlan(plan));
    EXPECT_LE(plan.stats().max_over_lb_state_bytes(), 1.05);
    EXPECT_LE(plan.stats().max_over_lb_ns_flops(), 1.05);
  }
}

}  // namespace
}  // namespace muonshard::importer
