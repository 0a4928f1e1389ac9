// The sharded optimizer on the CUDA backend (label gpu; skipped without a
// device): every buffer in device memory, one rank (a single GPU has no
// peer for NCCL), against the CPU ReferenceOptimizer. Several dtypes,
// expert stacks, both policies and bf16 gradients cover every device path
// the fake-device tests cover on the CPU, now on real device memory.

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/kernel_backend.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/workload/regression_workload.h"
#include "worker/workload/synthetic_workload.h"

namespace muonshard::worker::testing {
namespace {

bool HaveCudaBackend() { return kernels::CreateKernelBackend(kernels::DeviceKind::kCuda, 0).ok(); }

struct GpuCase {
  const char* name;
  bool stacks;  // StackManifest (bf16/fp16/fp32, 3-D stacks) or a dense model
  PolicyKind policy;
};

void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.name; }

class ShardedOptimizerGpuTest : public ::testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override {
    if (!HaveCudaBackend()) GTEST_SKIP() << "no CUDA device (or no GPU plugin)";
    const v1::ModelManifest manifest =
        GetParam().stacks ? StackManifest() : muonshard::testing::DenseManifest(2, 64, 96, 80);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(plan_, BuildPlan(manifest, /*world=*/1, /*ep=*/1, GetParam().policy));
  }

  struct GpuRun {
    std::vector<RankResult> ranks;
    ReferenceRun reference;
  };

  // Three steps on the GPU and the same on the CPU reference, both with
  // `precision` matmuls in Newton–Schulz.
  absl::StatusOr<GpuRun> Run(const Workload& workload, kernels::MatmulPrecision precision) {
    RunOptions options;
    options.steps = 3;
    options.config.ns.precision = precision;
    options.kernels = KernelKind::kCuda;
    GpuRun run;
    MUONSHARD_ASSIGN_OR_RETURN(run.ranks, RunSharded(plan_, workload, options));
    options.kernels = KernelKind::kCpu;
    MUONSHARD_ASSIGN_OR_RETURN(run.reference, RunReference(plan_, workload, options));
    return run;
  }

  v1::Plan plan_;
};

// Tolerances as NOTE [GPU tolerance] in worker_nccl_test.cc: fp32 matmuls
// on both sides differ by summation order only (1e-3 of each tensor's
// scale); bf16 on the GPU is compared with the CPU's bf16 emulation (1e-2).
TEST_P(ShardedOptimizerGpuTest, Fp32Matmuls_MatchTheCpuReference) {
  RegressionWorkload workload;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(GpuRun run, Run(workload, kernels::MatmulPrecision::kFp32));
  ExpectMatchesReference(plan_, run.ranks, run.reference, /*rtol=*/1e-3);
  EXPECT_EQ(run.ranks[0].state_bytes, plan_.ranks(0).optimizer_state_bytes());
}

// Synthetic gradients do not depend on the parameters, so the comparison
// measures the update alone.
TEST_P(ShardedOptimizerGpuTest, Bf16Matmuls_MatchTheCpuBf16Emulation) {
  SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(GpuRun run, Run(workload, kernels::MatmulPrecision::kBf16));
  const double error = MaxScaledMasterError(plan_, run.ranks, run.reference);
  RecordProperty("max_scaled_master_error", std::to_string(error));
  EXPECT_LT(error, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Plans, ShardedOptimizerGpuTest,
                         ::testing::Values(GpuCase{"Dense_Seed", false, PolicyKind::kSeed},
                                           GpuCase{"Stacks_Seed", true, PolicyKind::kSeed},
                                           GpuCase{"Stacks_Balanced", true, PolicyKind::kBalanced}),
                         [](const ::testing::TestParamInfo<GpuCase>& info) { return info.param.name; });

}  // namespace
}  // namespace muonshard::worker::testing
