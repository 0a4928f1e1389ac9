#ifndef MUONSHARD_TESTS_WORKER_OPTIMIZER_TEST_UTIL_H_
#define MUONSHARD_TESTS_WORKER_OPTIMIZER_TEST_UTIL_H_

// Helpers for ShardedOptimizer tests: plans for each policy, communicators
// for every group of a plan (in-process or Gloo on 127.0.0.1), a full
// multi-rank training run with threads as ranks, the matching reference run,
// and float comparisons (bitwise and with a tolerance).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "muonshard/v1/plan.pb.h"
#include "tests/worker/fake_streams.h"
#include "worker/comm/communicator.h"
#include "worker/comm/in_process_communicator.h"
#include "worker/optimizer/optimizer_config.h"
#include "worker/optimizer/reference_optimizer.h"
#include "worker/optimizer/sharded_optimizer.h"
#include "worker/optimizer/step_stats.h"
#include "worker/workload/workload.h"

namespace muonshard::worker::testing {

// kUneven is MakeUnevenPlan (uneven_plan.h) of the SEED_ALL plan.
enum class PolicyKind { kSeed, kSeedAll, kUneven, kBalanced };
std::string PolicyName(PolicyKind policy);

// A small MoE-style manifest with fused 3-D expert stacks (bf16 and fp16
// Muon, an AdamW "bias" stack), fp32 and bf16 2-D Muon tensors (one IN_OUT),
// and AdamW tensors of all three dtypes.
v1::ModelManifest StackManifest();

// `manifest` with every tensor in `dtype` (NOTE [FP32 masters] tests).
v1::ModelManifest WithDType(v1::ModelManifest manifest, v1::DType dtype);

// The plan of `manifest` on `world` ranks with expert parallelism `ep`.
absl::StatusOr<v1::Plan> BuildPlan(const v1::ModelManifest& manifest, int world, int ep, PolicyKind policy,
                                   int comm_buffer_mb = 0);

// A named plan of a parameterised suite (BuildPlan's arguments).
struct PlanCase {
  std::string name;
  v1::ModelManifest manifest;
  int world;
  int ep;
  PolicyKind policy;
  int comm_buffer_mb;
};
inline absl::StatusOr<v1::Plan> BuildPlan(const PlanCase& c) {
  return BuildPlan(c.manifest, c.world, c.ep, c.policy, c.comm_buffer_mb);
}

// Communicators of every group of a plan, indexed for each rank.
struct PlanComms {
  std::vector<std::unique_ptr<Communicator>> owned;
  std::vector<ShardedOptimizer::CommGroups> by_rank;
};
absl::StatusOr<PlanComms> CreateInProcessPlanComms(const v1::Plan& plan, const InProcessOptions& options = {});

enum class CommBackend { kInProcess, kGloo };
// kFakeDevice: FakeDeviceBackend, the device code paths on the CPU kernels.
// kCuda: the CUDA backend on device 0 (through the GPU plugin).
// kStreamedDevice: a FakeDeviceBackend behind a DeferredDeviceBackend, with
// the rank's communicators behind DeferredCommunicators (fake_streams.h):
// kernels and collectives run asynchronously on streams of their own.
enum class KernelKind { kCpu, kFakeDevice, kCuda, kStreamedDevice };

struct RunOptions {
  CommBackend backend = CommBackend::kInProcess;
  KernelKind kernels = KernelKind::kCpu;
  int steps = 3;
  // Hand the gradients over in the kernel backend's memory
  // (ShardedOptimizer::Step(BackendGradientSource&)), uploaded there first,
  // instead of as host spans.
  bool backend_gradients = false;
  // Hand the gradients over one by one (BeginStep, GradReady, FinishStep:
  // NOTE [Gradient hand-off]) in an order shuffled per rank and step,
  // instead of with Step().
  bool shuffled_hand_off = false;
  OptimizerConfig config;
  StepOptions step;
  absl::Duration timeout = absl::Seconds(60);
  // kStreamedDevice only: the fake streams' random delays, seed (plus the
  // rank) and negative control.
  FakeStreamOptions streams;
};

// What one rank ends with.
struct RankResult {
  std::map<int, std::vector<float>> model;    // held parts' model copies
  std::map<int, std::vector<float>> masters;  // GatherMasters()
  std::vector<StepStats> steps;
  std::vector<double> losses;  // per step, before it
  int64_t state_bytes = 0;
};

// `options.steps` training steps of `workload` on every rank of `plan`, one
// thread per rank, each with its own kernel backend (options.kernels).
absl::StatusOr<std::vector<RankResult>> RunSharded(const v1::Plan& plan, const Workload& workload,
                                                   const RunOptions& options);

struct ReferenceRun {
  std::unique_ptr<kernels::KernelBackend> backend;
  std::unique_ptr<ReferenceOptimizer> optimizer;
  std::vector<std::vector<double>> losses;  // [step][rank]
};
absl::StatusOr<ReferenceRun> RunReference(const v1::Plan& plan, const Workload& workload, const RunOptions& options);

// Every rank's model copies, gathered masters, losses and per-step comm
// bytes are bitwise the same in both runs.
void ExpectBitIdentical(const std::vector<RankResult>& a, const std::vector<RankResult>& b);

// Checks every rank's model copies, gathered masters and losses against the
// reference: bitwise when rtol == 0, else masters with NearScaled(rtol),
// model copies with NearModelCopy(rtol) and losses relatively within 1e-4.
void ExpectMatchesReference(const v1::Plan& plan, const std::vector<RankResult>& ranks, const ReferenceRun& reference,
                            double rtol);

// The largest NearScaled error (max |a - e| / max |e| per tensor) over every
// rank's masters, for reporting how close a non-bitwise backend came.
double MaxScaledMasterError(const v1::Plan& plan, const std::vector<RankResult>& ranks, const ReferenceRun& reference);

// Element-wise bitwise equality.
::testing::AssertionResult BitEqual(absl::Span<const float> actual, absl::Span<const float> expected);
// |a - e| <= rtol * max(|e|, max_abs(expected)) + 0, i.e. relative to the
// tensor's scale, so elements near zero are not held to a relative bound
// their summation-order error cannot meet.
::testing::AssertionResult NearScaled(absl::Span<const float> actual, absl::Span<const float> expected, double rtol);
// Model copies: NearScaled(rtol) plus one unit in the last place of `dtype`
// (a master within tolerance may round to the neighbouring 16-bit value).
::testing::AssertionResult NearModelCopy(absl::Span<const float> actual, absl::Span<const float> expected,
                                         v1::DType dtype, double rtol);

}  // namespace muonshard::worker::testing

#endif  // MUONSHARD_TESTS_WORKER_OPTIMIZER_TEST_UTIL_H_
