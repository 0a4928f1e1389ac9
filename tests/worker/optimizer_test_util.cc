#include "tests/worker/optimizer_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rendezvous_store.h"
#include "common/status_macros.h"
#include "kernels/kernel_backend.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/worker/comm_test_util.h"
#include "tests/worker/fake_device_backend.h"
#include "tests/worker/uneven_plan.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/workload/workload_driver.h"

namespace muonshard::worker::testing {
namespace {

v1::Policy ToPolicy(PolicyKind p) {
  switch (p) {
    case PolicyKind::kSeed:
      return v1::SEED;
    case PolicyKind::kBalanced:
      return v1::BALANCED;
    default:
      return v1::SEED_ALL;
  }
}

// One rank's communicators for the Gloo run, created in ascending group id
// (the same order on every rank, so the blocking rendezvous cannot deadlock).
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateGlooComms(const v1::Plan& plan, int rank,
                                                                           RendezvousStore* store,
                                                                           absl::Duration timeout,
                                                                           ShardedOptimizer::CommGroups* by_id) {
  std::vector<std::unique_ptr<Communicator>> comms;
  for (const v1::CommGroup& g : plan.groups()) {
    auto at = std::find(g.ranks().begin(), g.ranks().end(), rank);
    if (at == g.ranks().end() || g.ranks_size() < 2) continue;
    GlooOptions o;
    o.rank = static_cast<int>(at - g.ranks().begin());
    o.size = g.ranks_size();
    o.key_prefix = absl::StrCat("test/gloo/group/", g.id(), "/");
    o.timeout = timeout;
    MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, CreateGlooCommunicator(o, store));
    (*by_id)[g.id()] = comm.get();
    comms.push_back(std::move(comm));
  }
  return comms;
}

absl::StatusOr<std::unique_ptr<kernels::KernelBackend>> MakeKernelBackend(KernelKind kind) {
  switch (kind) {
    case KernelKind::kFakeDevice:
      return std::make_unique<testing::FakeDeviceBackend>();
    case KernelKind::kCuda:
      return kernels::CreateKernelBackend(kernels::DeviceKind::kCuda, 0);
    case KernelKind::kCpu:
    case KernelKind::kStreamedDevice:  // RunRank's StreamedRank
      break;
  }
  return kernels::CreateCpuKernelBackend();
}

// TrainStep with the gradients uploaded into the backend's memory first and
// handed over as BackendGradients (device pointers on a device backend).
absl::StatusOr<TrainStepResult> TrainStepOnBackend(const Workload& workload, ShardedOptimizer& optimizer,
                                                   kernels::KernelBackend& backend, int rank, int step) {
  auto read = [&](const HeldTensor& h, absl::Span<float> out) { return optimizer.ReadModelCopy(h.tensor, out); };
  MUONSHARD_ASSIGN_OR_RETURN(
      LocalGradients local, ComputeLocalGradients(workload, optimizer.held_tensors(), DataRank(optimizer), step, read));
  std::vector<kernels::BackendMemory> memory;
  BackendGradientMap grads;
  for (const HeldTensor& h : optimizer.held_tensors()) {
    MUONSHARD_ASSIGN_OR_RETURN(absl::Span<const float> host, local.grads.PartGradient(h.tensor));
    const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(float));
    MUONSHARD_ASSIGN_OR_RETURN(kernels::BackendMemory m, backend.Allocate(bytes));
    MUONSHARD_RETURN_IF_ERROR(backend.CopyFromHost(host.data(), m.get(), bytes));
    grads.Set(h.tensor, BackendGradient{m.get(), kernels::ElementType::kFloat32, h.numel()});
    memory.push_back(std::move(m));
  }
  TrainStepResult result;
  result.loss = local.loss;
  MUONSHARD_ASSIGN_OR_RETURN(result.stats, optimizer.Step(grads));
  // Before the uploads are freed: the step's conversions read them.
  MUONSHARD_RETURN_IF_ERROR(backend.Synchronize());
  return result;
}

// TrainStep with the gradients handed over one by one in a shuffled order.
absl::StatusOr<TrainStepResult> TrainStepHandOff(const Workload& workload, ShardedOptimizer& optimizer, int rank,
                                                 int step) {
  auto read = [&](const HeldTensor& h, absl::Span<float> out) { return optimizer.ReadModelCopy(h.tensor, out); };
  MUONSHARD_ASSIGN_OR_RETURN(
      LocalGradients local, ComputeLocalGradients(workload, optimizer.held_tensors(), DataRank(optimizer), step, read));
  std::vector<int> tensors;
  for (const HeldTensor& h : optimizer.held_tensors()) tensors.push_back(h.tensor);
  std::mt19937 rng(static_cast<uint32_t>(1000 * rank + step));
  std::shuffle(tensors.begin(), tensors.end(), rng);
  MUONSHARD_RETURN_IF_ERROR(optimizer.BeginStep());
  for (int tensor : tensors) {
    MUONSHARD_ASSIGN_OR_RETURN(absl::Span<const float> grad, local.grads.PartGradient(tensor));
    MUONSHARD_RETURN_IF_ERROR(optimizer.GradReady(tensor, grad));
  }
  TrainStepResult result;
  result.loss = local.loss;
  MUONSHARD_ASSIGN_OR_RETURN(result.stats, optimizer.FinishStep());
  return result;
}

absl::StatusOr<TrainStepResult> RunTrainStep(const Workload& workload, ShardedOptimizer& optimizer,
                                             kernels::KernelBackend& backend, int rank, int step,
                                             const RunOptions& options) {
  if (options.backend_gradients) return TrainStepOnBackend(workload, optimizer, backend, rank, step);
  if (options.shuffled_hand_off) return TrainStepHandOff(workload, optimizer, rank, step);
  return TrainStep(workload, optimizer, step);
}

absl::StatusOr<RankResult> RunRank(const v1::Plan& plan, int rank, ShardedOptimizer::CommGroups comms,
                                   const Workload& workload, const RunOptions& options) {
  MUONSHARD_ASSIGN_OR_RETURN(const v1::RankView view, planner::ExtractRankView(plan, rank));
  FakeStreamOptions streams = options.streams;
  streams.seed += 1000 * static_cast<uint32_t>(rank);
  StreamedRank streamed(streams);  // outlives the backend and the optimizer
  std::unique_ptr<kernels::KernelBackend> backend;
  if (options.kernels == KernelKind::kStreamedDevice) {
    streamed.Defer(&comms);
    backend = streamed.Backend(std::make_unique<FakeDeviceBackend>());
  } else {
    MUONSHARD_ASSIGN_OR_RETURN(backend, MakeKernelBackend(options.kernels));
  }
  MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<ShardedOptimizer> optimizer,
                             ShardedOptimizer::Create(view, comms, backend.get(), options.config, options.step));
  MUONSHARD_RETURN_IF_ERROR(InitializeParameters(workload, *optimizer));
  RankResult result;
  for (int step = 0; step < options.steps; ++step) {
    MUONSHARD_ASSIGN_OR_RETURN(TrainStepResult r, RunTrainStep(workload, *optimizer, *backend, rank, step, options));
    result.steps.push_back(r.stats);
    result.losses.push_back(r.loss);
  }
  for (const HeldTensor& h : optimizer->held_tensors()) {
    MUONSHARD_ASSIGN_OR_RETURN(result.model[h.tensor], optimizer->ModelCopy(h.tensor));
  }
  MUONSHARD_ASSIGN_OR_RETURN(result.masters, optimizer->GatherMasters());
  result.state_bytes = optimizer->optimizer_state_bytes();
  return result;
}

// Units in the last place of `dtype` at magnitude |x|.
double Ulp(double x, v1::DType dtype) {
  const int mantissa_bits = dtype == v1::BF16 ? 7 : dtype == v1::FP16 ? 10 : 23;
  const int min_exponent = dtype == v1::FP16 ? -14 : -126;
  int exponent = 0;
  std::frexp(std::abs(x), &exponent);  // |x| = m * 2^exponent, m in [0.5, 1)
  return std::ldexp(1.0, std::max(exponent - 1, min_exponent) - mantissa_bits);
}

}  // namespace

std::string PolicyName(PolicyKind policy) {
  switch (policy) {
    case PolicyKind::kSeed:
      return "Seed";
    case PolicyKind::kSeedAll:
      return "SeedAll";
    case PolicyKind::kUneven:
      return "Uneven";
    case PolicyKind::kBalanced:
      return "Balanced";
  }
  return "Unknown";
}

v1::ModelManifest WithDType(v1::ModelManifest manifest, v1::DType dtype) {
  for (v1::TensorSpec& t : *manifest.mutable_tensors()) t.set_dtype(dtype);
  return manifest;
}

v1::ModelManifest StackManifest() {
  muonshard::testing::ManifestBuilder b("stacks");
  b.Add("model.embed_tokens.weight", {96, 64}, v1::FP32)
      .Add("model.layers.0.self_attn.q_proj.weight", {64, 64}, v1::BF16)
      .Add("model.layers.0.self_attn.o_proj.weight", {64, 48}, v1::FP32)
      .Add("model.layers.0.self_attn.o_proj.bias", {64}, v1::FP32)
      .Add("model.layers.0.mlp.gate.weight", {4, 64}, v1::FP32)
      .Add("model.layers.0.mlp.experts.gate_up_proj", {4, 64, 48}, v1::BF16)
      .Add("model.layers.0.mlp.experts.down_proj", {4, 24, 64}, v1::FP16)
      .Add("model.layers.0.mlp.experts.down_bias", {4, 1, 40}, v1::BF16)
      .Add("model.layers.0.input_layernorm.weight", {64}, v1::BF16)
      .Add("model.layers.0.post_attention_layernorm.weight", {64}, v1::FP16)
      .Add("model.layers.1.self_attn.q_proj.weight", {32, 64}, v1::BF16)
      .Add("model.layers.1.mlp.experts.gate_up_proj", {4, 64, 16}, v1::BF16)
      .Add("model.norm.weight", {64}, v1::FP32)
      .Add("lm_head.weight", {96, 64}, v1::BF16);
  v1::ModelManifest m = b.Build();
  // Paddle's [in, out] layout for one Muon matrix and one stack.
  m.mutable_tensors(2)->set_layout(v1::IN_OUT);
  m.mutable_tensors(5)->set_layout(v1::IN_OUT);
  return m;
}

absl::StatusOr<v1::Plan> BuildPlan(const v1::ModelManifest& manifest, int world, int ep, PolicyKind policy,
                                   int comm_buffer_mb) {
  v1::PlanRequest request =
      muonshard::testing::MakeRequest(manifest, world, /*pp=*/1, ep, ToPolicy(policy), comm_buffer_mb);
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan plan, planner::ComputePlan(request));
  if (policy == PolicyKind::kUneven) return MakeUnevenPlan(plan);
  return plan;
}

absl::StatusOr<PlanComms> CreateInProcessPlanComms(const v1::Plan& plan, const InProcessOptions& options) {
  PlanComms comms;
  comms.by_rank.resize(plan.ranks_size());
  for (const v1::CommGroup& g : plan.groups()) {
    MUONSHARD_ASSIGN_OR_RETURN(auto group, CreateInProcessCommunicators(g.ranks_size(), options));
    for (int i = 0; i < g.ranks_size(); ++i) {
      comms.by_rank[g.ranks(i)][g.id()] = group[i].get();
      comms.owned.push_back(std::move(group[i]));
    }
  }
  return comms;
}

absl::StatusOr<std::vector<RankResult>> RunSharded(const v1::Plan& plan, const Workload& workload,
                                                   const RunOptions& options) {
  const int world = plan.ranks_size();
  std::vector<absl::StatusOr<RankResult>> results;
  if (options.backend == CommBackend::kInProcess) {
    InProcessOptions o;
    o.timeout = options.timeout;
    MUONSHARD_ASSIGN_OR_RETURN(PlanComms comms, CreateInProcessPlanComms(plan, o));
    results = RunRanks<RankResult>(
        world, [&](int rank) { return RunRank(plan, rank, comms.by_rank[rank], workload, options); });
  } else {
    InMemoryRendezvousStore store;
    results = RunRanks<RankResult>(world, [&](int rank) -> absl::StatusOr<RankResult> {
      ShardedOptimizer::CommGroups by_id;
      MUONSHARD_ASSIGN_OR_RETURN(auto comms, CreateGlooComms(plan, rank, &store, options.timeout, &by_id));
      return RunRank(plan, rank, by_id, workload, options);
    });
  }
  std::vector<RankResult> out;
  for (int r = 0; r < world; ++r) {
    if (!results[r].ok()) return Annotate(results[r].status(), absl::StrCat("rank ", r));
    out.push_back(*std::move(results[r]));
  }
  return out;
}

absl::StatusOr<ReferenceRun> RunReference(const v1::Plan& plan, const Workload& workload, const RunOptions& options) {
  ReferenceRun run;
  run.backend = kernels::CreateCpuKernelBackend();
  MUONSHARD_ASSIGN_OR_RETURN(run.optimizer, ReferenceOptimizer::Create(plan, run.backend.get(), options.config));
  MUONSHARD_RETURN_IF_ERROR(InitializeParameters(workload, *run.optimizer));
  for (int step = 0; step < options.steps; ++step) {
    MUONSHARD_ASSIGN_OR_RETURN(std::vector<double> losses, TrainStep(workload, *run.optimizer, step));
    run.losses.push_back(std::move(losses));
  }
  return run;
}

void ExpectBitIdentical(const std::vector<RankResult>& a, const std::vector<RankResult>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_EQ(a[r].model.size(), b[r].model.size());
    for (const auto& [tensor, values] : a[r].model) {
      EXPECT_TRUE(BitEqual(values, b[r].model.at(tensor))) << "model copy of tensor " << tensor;
    }
    ASSERT_EQ(a[r].masters.size(), b[r].masters.size());
    for (const auto& [tensor, values] : a[r].masters) {
      EXPECT_TRUE(BitEqual(values, b[r].masters.at(tensor))) << "master of tensor " << tensor;
    }
    EXPECT_EQ(a[r].losses, b[r].losses);
    ASSERT_EQ(a[r].steps.size(), b[r].steps.size());
    for (size_t s = 0; s < a[r].steps.size(); ++s) EXPECT_TRUE(a[r].steps[s].comm == b[r].steps[s].comm);
  }
}

void ExpectMatchesReference(const v1::Plan& plan, const std::vector<RankResult>& ranks, const ReferenceRun& reference,
                            double rtol) {
  ASSERT_EQ(static_cast<int>(ranks.size()), plan.ranks_size());
  for (int r = 0; r < plan.ranks_size(); ++r) {
    const std::vector<HeldTensor>& held = reference.optimizer->HeldTensorsOf(r);
    ASSERT_EQ(ranks[r].model.size(), held.size()) << "rank " << r;
    ASSERT_EQ(ranks[r].masters.size(), held.size()) << "rank " << r;
    for (const HeldTensor& h : held) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " tensor \"", h.spec->name(), "\""));
      std::vector<float> model(h.numel());
      ASSERT_TRUE(reference.optimizer->ReadModelCopy(h.tensor, h.element_begin, absl::MakeSpan(model)).ok());
      const absl::Span<const float> master =
          absl::MakeConstSpan(reference.optimizer->master(h.tensor)).subspan(h.element_begin, h.numel());
      if (rtol == 0) {
        EXPECT_TRUE(BitEqual(ranks[r].model.at(h.tensor), model));
        EXPECT_TRUE(BitEqual(ranks[r].masters.at(h.tensor), master));
      } else {
        EXPECT_TRUE(NearModelCopy(ranks[r].model.at(h.tensor), model, h.spec->dtype(), rtol));
        EXPECT_TRUE(NearScaled(ranks[r].masters.at(h.tensor), master, rtol));
      }
    }
    ASSERT_EQ(ranks[r].losses.size(), reference.losses.size());
    for (size_t step = 0; step < reference.losses.size(); ++step) {
      if (rtol == 0) {
        EXPECT_EQ(ranks[r].losses[step], reference.losses[step][r]) << "rank " << r << " step " << step;
      } else {
        EXPECT_NEAR(ranks[r].losses[step], reference.losses[step][r], 1e-4 * std::abs(reference.losses[step][r]))
            << "rank " << r << " step " << step;
      }
    }
  }
}

double MaxScaledMasterError(const v1::Plan& plan, const std::vector<RankResult>& ranks, const ReferenceRun& reference) {
  double worst = 0;
  for (int r = 0; r < plan.ranks_size(); ++r) {
    for (const HeldTensor& h : reference.optimizer->HeldTensorsOf(r)) {
      const std::vector<float>& actual = ranks[r].masters.at(h.tensor);
      const std::vector<float>& master = reference.optimizer->master(h.tensor);
      double scale = 0;
      double diff = 0;
      for (int64_t i = 0; i < h.numel(); ++i) {
        const double e = master[h.element_begin + i];
        scale = std::max(scale, std::abs(e));
        diff = std::max(diff, std::abs(double{actual[i]} - e));
      }
      if (scale > 0) worst = std::max(worst, diff / scale);
    }
  }
  return worst;
}

::testing::AssertionResult BitEqual(absl::Span<const float> actual, absl::Span<const float> expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "sizes " << actual.size() << " vs " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << actual[i] << " vs expected " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult NearScaled(absl::Span<const float> actual, absl::Span<const float> expected, double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "sizes " << actual.size() << " vs " << expected.size();
  }
  double scale = 0;
  for (float e : expected) scale = std::max(scale, std::abs(double{e}));
  for (size_t i = 0; i < actual.size(); ++i) {
    const double diff = std::abs(double{actual[i]} - double{expected[i]});
    if (!(diff <= rtol * scale)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << actual[i] << " vs expected " << expected[i] << " (|diff| " << diff << " > "
             << rtol << " * max |expected| " << scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult NearModelCopy(absl::Span<const float> actual, absl::Span<const float> expected,
                                         v1::DType dtype, double rtol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "sizes " << actual.size() << " vs " << expected.size();
  }
  double scale = 0;
  for (float e : expected) scale = std::max(scale, std::abs(double{e}));
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i];
    const double e = expected[i];
    const double slack = rtol * scale + Ulp(std::max(std::abs(a), std::abs(e)), dtype);
    if (!(std::abs(a - e) <= slack)) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a << " vs expected " << e << " (|diff| > "
                                           << rtol << " * " << scale << " + 1 ulp of " << v1::DType_Name(dtype) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace muonshard::worker::testing
