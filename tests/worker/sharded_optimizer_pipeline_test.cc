// ShardedOptimizer's pipelined schedule and gradient hand-off (NOTE
// [Pipelined step], NOTE [Gradient hand-off] in sharded_optimizer.h): the
// pipelined step is bit-identical to the sequential one (in-process and Gloo
// groups, every policy), handing gradients over one by one in any order
// equals Step(), the hand-off's errors, a failure cancels the step on every
// rank at once, and the pipeline really overlaps: a step whose last reduce
// can only finish after an update ran completes pipelined and deadlocks
// (to its timeout) sequentially.

#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/kernel_backend.h"
#include "plan/ns_batches.h"
#include "plan/plan_view.h"
#include "sim/plan_program.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/comm_test_util.h"
#include "tests/worker/fake_device_backend.h"
#include "tests/worker/fake_streams.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/optimizer/internal/step_pipeline.h"
#include "worker/workload/synthetic_workload.h"
#include "worker/workload/workload_driver.h"

namespace muonshard::worker::testing {
namespace {

using ::muonshard::testing::IsOk;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

using Case = PlanCase;

std::vector<Case> Cases() {
  return {
      {"Moe_W4_Ep2_SeedAll", muonshard::testing::MoeManifest(2, 64, 32, 4, 80), 4, 2, PolicyKind::kSeedAll, 0},
      {"Stacks_W4_Ep2_Uneven", StackManifest(), 4, 2, PolicyKind::kUneven, 0},
      {"Dense_W3_Balanced", muonshard::testing::DenseManifest(2, 64, 96, 80), 3, 1, PolicyKind::kBalanced, 0},
      {"Stacks_W2_Seed", StackManifest(), 2, 1, PolicyKind::kSeed, 0},
  };
}

class PipelineEquivalenceTest : public ::testing::TestWithParam<std::tuple<int, CommBackend>> {};

TEST_P(PipelineEquivalenceTest, Pipelined_IsBitIdenticalToSequential) {
  const Case c = Cases()[std::get<0>(GetParam())];
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(c));
  SyntheticWorkload workload;
  RunOptions options;
  options.backend = std::get<1>(GetParam());
  options.step.schedule = StepSchedule::kSequential;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> sequential, RunSharded(plan, workload, options));
  options.step.schedule = StepSchedule::kPipelined;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> pipelined, RunSharded(plan, workload, options));
  ExpectBitIdentical(pipelined, sequential);
  // The gradients handed over one by one, in another order on every rank.
  options.shuffled_hand_off = true;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> handed, RunSharded(plan, workload, options));
  ExpectBitIdentical(handed, sequential);
  options.step.schedule = StepSchedule::kSequential;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> handed_sequential, RunSharded(plan, workload, options));
  ExpectBitIdentical(handed_sequential, sequential);
}

INSTANTIATE_TEST_SUITE_P(Cases, PipelineEquivalenceTest,
                         ::testing::Combine(::testing::Range(0, 4),
                                            ::testing::Values(CommBackend::kInProcess, CommBackend::kGloo)),
                         [](const auto& info) {
                           return absl::StrCat(Cases()[std::get<0>(info.param)].name,
                                               std::get<1>(info.param) == CommBackend::kGloo ? "_Gloo" : "_InProcess");
                         });

TEST(PipelineEquivalenceTest, Pipelined_WithSmallBuckets_MatchesTheReferenceBitwise) {
  // Many buckets: every step interleaves reduces, updates and broadcasts.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 4, 2, PolicyKind::kBalanced, 1));
  SyntheticWorkload workload;
  RunOptions options;
  options.step.schedule = StepSchedule::kPipelined;
  options.shuffled_hand_off = true;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<RankResult> ranks, RunSharded(plan, workload, options));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ReferenceRun reference, RunReference(plan, workload, options));
  ExpectMatchesReference(plan, ranks, reference, 0);
}

// --- the hand-off's contract, on two ranks over in-process groups ---

class HandOffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(plan_, BuildPlan(StackManifest(), 2, 1, PolicyKind::kSeed));
    InProcessOptions o;
    o.timeout = absl::Seconds(20);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(comms_, CreateInProcessPlanComms(plan_, o));
  }

  absl::StatusOr<std::unique_ptr<ShardedOptimizer>> Create(int rank, kernels::KernelBackend* backend,
                                                           StepSchedule schedule) {
    MUONSHARD_ASSIGN_OR_RETURN(v1::RankView view, planner::ExtractRankView(plan_, rank));
    StepOptions step;
    step.schedule = schedule;
    MUONSHARD_ASSIGN_OR_RETURN(auto optimizer, ShardedOptimizer::Create(view, comms_.by_rank[rank], backend, {}, step));
    MUONSHARD_RETURN_IF_ERROR(InitializeParameters(workload_, *optimizer));
    return optimizer;
  }

  v1::Plan plan_;
  PlanComms comms_;
  SyntheticWorkload workload_;
};

TEST_F(HandOffTest, GradReady_OutsideAStep_TwiceOrBadSize_IsRejectedAndTheStepStillCompletes) {
  std::vector<absl::Status> results = RunRanksStatus(2, [&](int rank) -> absl::Status {
    std::unique_ptr<kernels::KernelBackend> backend = kernels::CreateCpuKernelBackend();
    MUONSHARD_ASSIGN_OR_RETURN(auto optimizer, Create(rank, backend.get(), StepSchedule::kPipelined));
    const std::vector<HeldTensor>& held = optimizer->held_tensors();
    std::vector<float> grad(held[0].numel(), 0.25f);
    auto expect = [](const absl::Status& s, absl::StatusCode code, absl::string_view what) -> absl::Status {
      if (s.code() == code) return absl::OkStatus();
      return absl::InternalError(absl::StrCat(what, ": ", s.ToString()));
    };
    MUONSHARD_RETURN_IF_ERROR(
        expect(optimizer->GradReady(held[0].tensor, grad), absl::StatusCode::kFailedPrecondition, "before BeginStep"));
    MUONSHARD_RETURN_IF_ERROR(
        expect(optimizer->FinishStep().status(), absl::StatusCode::kFailedPrecondition, "FinishStep before BeginStep"));
    MUONSHARD_RETURN_IF_ERROR(optimizer->BeginStep());
    MUONSHARD_RETURN_IF_ERROR(expect(optimizer->BeginStep(), absl::StatusCode::kFailedPrecondition, "BeginStep twice"));
    MUONSHARD_RETURN_IF_ERROR(expect(optimizer->GradReady(held[0].tensor, absl::MakeSpan(grad).subspan(1)),
                                     absl::StatusCode::kInvalidArgument, "short gradient"));
    MUONSHARD_RETURN_IF_ERROR(expect(optimizer->GradReady(123456, grad), absl::StatusCode::kNotFound, "unknown"));
    MUONSHARD_RETURN_IF_ERROR(expect(optimizer->GatherMasters().status(), absl::StatusCode::kFailedPrecondition,
                                     "GatherMasters inside a step"));
    MUONSHARD_RETURN_IF_ERROR(expect(optimizer->SetParameter(held[0].tensor, grad),
                                     absl::StatusCode::kFailedPrecondition, "SetParameter inside a step"));
    for (const HeldTensor& h : held) {
      std::vector<float> g(h.numel(), 0.25f);
      MUONSHARD_RETURN_IF_ERROR(optimizer->GradReady(h.tensor, g));
    }
    MUONSHARD_RETURN_IF_ERROR(
        expect(optimizer->GradReady(held[0].tensor, grad), absl::StatusCode::kInvalidArgument, "handed twice"));
    MUONSHARD_ASSIGN_OR_RETURN(StepStats stats, optimizer->FinishStep());
    if (stats.comm.total() == 0) return absl::InternalError("the step communicated nothing");
    if (optimizer->steps_done() != 1) return absl::InternalError("step not counted");
    return optimizer->GatherMasters().status();
  });
  for (int r = 0; r < 2; ++r) EXPECT_THAT(results[r], IsOk()) << "rank " << r;
}

TEST_F(HandOffTest, FinishStep_MissingGradient_Sequential_KeepsTheStepOpen) {
  std::vector<absl::Status> results = RunRanksStatus(2, [&](int rank) -> absl::Status {
    std::unique_ptr<kernels::KernelBackend> backend = kernels::CreateCpuKernelBackend();
    MUONSHARD_ASSIGN_OR_RETURN(auto optimizer, Create(rank, backend.get(), StepSchedule::kSequential));
    const std::vector<HeldTensor>& held = optimizer->held_tensors();
    MUONSHARD_RETURN_IF_ERROR(optimizer->BeginStep());
    for (size_t i = 1; i < held.size(); ++i) {
      MUONSHARD_RETURN_IF_ERROR(optimizer->GradReady(held[i].tensor, std::vector<float>(held[i].numel(), 0.5f)));
    }
    absl::Status missing = optimizer->FinishStep().status();
    if (missing.code() != absl::StatusCode::kFailedPrecondition ||
        !absl::StrContains(missing.message(), held[0].spec->name())) {
      return absl::InternalError(absl::StrCat("missing: ", missing.ToString()));
    }
    MUONSHARD_RETURN_IF_ERROR(optimizer->GradReady(held[0].tensor, std::vector<float>(held[0].numel(), 0.5f)));
    return optimizer->FinishStep().status();
  });
  for (int r = 0; r < 2; ++r) EXPECT_THAT(results[r], IsOk()) << "rank " << r;
}

TEST_F(HandOffTest, FinishStep_MissingGradient_Pipelined_BreaksAndAbortsThePeerAtOnce) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> results = RunRanksStatus(2, [&](int rank) -> absl::Status {
    std::unique_ptr<kernels::KernelBackend> backend = kernels::CreateCpuKernelBackend();
    MUONSHARD_ASSIGN_OR_RETURN(auto optimizer, Create(rank, backend.get(), StepSchedule::kPipelined));
    const std::vector<HeldTensor>& held = optimizer->held_tensors();
    MUONSHARD_RETURN_IF_ERROR(optimizer->BeginStep());
    // Rank 0 forgets its first tensor; rank 1 hands over everything.
    for (size_t i = rank == 0 ? 1 : 0; i < held.size(); ++i) {
      MUONSHARD_RETURN_IF_ERROR(optimizer->GradReady(held[i].tensor, std::vector<float>(held[i].numel(), 0.5f)));
    }
    absl::Status finish = optimizer->FinishStep().status();
    absl::Status after = optimizer->BeginStep();
    if (after.code() != absl::StatusCode::kFailedPrecondition || !absl::StrContains(after.message(), "broken")) {
      return absl::InternalError(absl::StrCat("after: ", after.ToString()));
    }
    return finish;
  });
  EXPECT_THAT(results[0], StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("was not handed over")));
  EXPECT_THAT(results[1], StatusIs(absl::StatusCode::kAborted, ::testing::_));
  // The abort ends the peer's wait, not its 20 s timeout.
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

// --- overlap, proven by a dependency only a pipeline can satisfy ---

// Counts the kernel updates of a backend (the CPU's by default).
class CountingCpuBackend final : public kernels::KernelBackend {
 public:
  explicit CountingCpuBackend(std::atomic<int>* updates,
                              std::unique_ptr<kernels::KernelBackend> inner = kernels::CreateCpuKernelBackend())
      : inner_(std::move(inner)), updates_(updates) {}
  kernels::DeviceKind device_kind() const override { return inner_->device_kind(); }
  absl::Status NewtonSchulz(const float* in, float* out, const kernels::MatrixBatchShape& shape,
                            const kernels::NewtonSchulzOptions& options) override {
    return inner_->NewtonSchulz(in, out, shape, options);
  }
  absl::Status NewtonSchulzShard(const float* in, float* out, const kernels::MatrixBatchShape& shard_shape,
                                 kernels::NsShardSplit split, const kernels::NewtonSchulzOptions& options,
                                 kernels::NsAllReduce all_reduce) override {
    return inner_->NewtonSchulzShard(in, out, shard_shape, split, options, all_reduce);
  }
  absl::Status MuonUpdate(const kernels::MuonTensors& t, const kernels::MatrixBatchShape& shape,
                          kernels::WeightLayout layout, const kernels::MuonOptions& options) override {
    ++*updates_;
    return inner_->MuonUpdate(t, shape, layout, options);
  }
  absl::Status MuonUpdateBatch(absl::Span<const kernels::MuonTensors> items, const kernels::MatrixBatchShape& shape,
                               kernels::WeightLayout layout, const kernels::MuonOptions& options) override {
    ++*updates_;
    largest_batch = std::max(largest_batch, static_cast<int>(items.size()));
    batches.push_back({static_cast<int>(items.size()), static_cast<int64_t>(items.size()) * shape.elements()});
    return inner_->MuonUpdateBatch(items, shape, layout, options);
  }
  absl::Status AdamW(const kernels::AdamWTensors& t, int64_t n, const kernels::AdamWBetaPows& pows,
                     const kernels::AdamWOptions& options) override {
    ++*updates_;
    return inner_->AdamW(t, n, pows, options);
  }
  absl::Status MuonMomentum(const float* grad, float* momentum, float* update, int64_t n,
                            const kernels::MuonOptions& options) override {
    return inner_->MuonMomentum(grad, momentum, update, n, options);
  }
  absl::Status MuonApply(const float* ortho, float* master, kernels::Bf16Bits* model, int64_t n,
                         const kernels::MuonApplyScalars& scalars) override {
    ++*updates_;
    return inner_->MuonApply(ortho, master, model, n, scalars);
  }
  absl::Status Copy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                      int64_t rows) override {
    return inner_->Copy2D(src, src_pitch, dst, dst_pitch, row_bytes, rows);
  }
  absl::Status CastToBf16(const float* in, kernels::Bf16Bits* out, int64_t n) override {
    return inner_->CastToBf16(in, out, n);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  absl::Status WaitForStream(std::uintptr_t stream) override { return inner_->WaitForStream(stream); }
  std::uintptr_t stream_handle() const override { return inner_->stream_handle(); }
  absl::StatusOr<kernels::StreamEvent> CreateEvent() override { return inner_->CreateEvent(); }
  absl::Status RecordEvent(const kernels::StreamEvent& event, std::uintptr_t stream) override {
    return inner_->RecordEvent(event, stream);
  }
  absl::Status WaitEvent(std::uintptr_t stream, const kernels::StreamEvent& event) override {
    return inner_->WaitEvent(stream, event);
  }
  int64_t host_copies() const override { return inner_->host_copies(); }
  absl::StatusOr<kernels::BackendMemory> Allocate(int64_t bytes) override { return inner_->Allocate(bytes); }
  absl::Status CopyFromHost(const void* host, void* dst, int64_t bytes) override {
    return inner_->CopyFromHost(host, dst, bytes);
  }
  absl::Status CopyToHost(const void* src, void* host, int64_t bytes) override {
    return inner_->CopyToHost(src, host, bytes);
  }
  absl::Status SetZero(void* dst, int64_t bytes) override { return inner_->SetZero(dst, bytes); }
  int largest_batch = 0;  // items of the largest MuonUpdateBatch call
  struct Batch {
    int items = 0;
    int64_t elements = 0;
  };
  std::vector<Batch> batches;  // every MuonUpdateBatch call
  absl::Status Convert(const void* in, kernels::ElementType in_type, void* out, kernels::ElementType out_type,
                       int64_t n) override {
    return inner_->Convert(in, in_type, out, out_type, n);
  }

 private:
  std::unique_ptr<kernels::KernelBackend> inner_;
  std::atomic<int>* updates_;
};

// Forwards to a communicator; the `gated_call`-th reduction (Reduce or
// ReduceScatter, counted from 0) of the step first waits up to `wait` for
// `*updates` to become positive, and fails DEADLINE_EXCEEDED if it does not.
class GatedCommunicator final : public Communicator {
 public:
  GatedCommunicator(Communicator* inner, const std::atomic<int>* updates, int gated_call, absl::Duration wait)
      : inner_(inner), updates_(updates), gated_call_(gated_call), wait_(wait) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status Reduce(void* buf, int64_t count, CommDType dtype, ReduceOp op, int root) override {
    MUONSHARD_RETURN_IF_ERROR(Gate());
    return inner_->Reduce(buf, count, dtype, op, root);
  }
  absl::Status ReduceScatter(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype,
                             ReduceOp op) override {
    MUONSHARD_RETURN_IF_ERROR(Gate());
    return inner_->ReduceScatter(in, out, counts, dtype, op);
  }
  absl::Status Broadcast(void* buf, int64_t count, CommDType dtype, int root) override {
    return inner_->Broadcast(buf, count, dtype, root);
  }
  absl::Status AllReduce(void* buf, int64_t count, CommDType dtype, ReduceOp op) override {
    return inner_->AllReduce(buf, count, dtype, op);
  }
  absl::Status AllGather(const void* in, void* out, absl::Span<const int64_t> counts, CommDType dtype) override {
    return inner_->AllGather(in, out, counts, dtype);
  }
  absl::Status Gather(const void* in, void* out, int64_t count, CommDType dtype, int root) override {
    return inner_->Gather(in, out, count, dtype, root);
  }
  absl::Status Scatter(const void* in, void* out, int64_t count, CommDType dtype, int root) override {
    return inner_->Scatter(in, out, count, dtype, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::Status GroupStart() override { return inner_->GroupStart(); }
  absl::Status GroupEnd() override { return inner_->GroupEnd(); }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }

 private:
  absl::Status Gate() {
    if (calls_++ != gated_call_) return absl::OkStatus();
    const absl::Time deadline = absl::Now() + wait_;
    while (updates_->load() == 0) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError("the gated reduction waited for an update that never ran");
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    return absl::OkStatus();
  }

  Communicator* inner_;
  const std::atomic<int>* updates_;
  const int gated_call_;
  const absl::Duration wait_;
  int calls_ = 0;
};

template <typename Entries>
int LastTensorOf(const Entries& entries) {
  int last = -1;
  for (const v1::BucketEntry& e : entries) last = std::max(last, e.tensor());
  return last;
}

// Whether `rank` updates a bucket of its group that is reduced before the
// group's last reduction (hand-off order: descending last tensor index, NOTE
// [Pipelined step]); and the number of reductions.
struct GateSpec {
  bool satisfiable = false;
  int reductions = 0;
};
GateSpec GateFor(const v1::Plan& plan, int group, int rank) {
  std::vector<std::pair<int, bool>> order;  // (last tensor, updated by rank)
  for (const v1::MuonBucket& b : plan.muon_buckets()) {
    if (b.group() == group) order.push_back({LastTensorOf(b.entries()), b.owner() == rank});
  }
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    if (b.group() == group) order.push_back({LastTensorOf(b.entries()), true});
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  GateSpec spec;
  spec.reductions = static_cast<int>(order.size());
  for (size_t i = 0; i + 1 < order.size(); ++i) spec.satisfiable |= order[i].second;
  return spec;
}

// Two ranks, one group. On every rank that updates a bucket reduced before
// its last one, the last reduction of the first step waits for an update
// of the same rank: only a schedule that updates early buckets while later
// ones are still being reduced gets past it. `on_streams`: the kernels and
// the collectives on fake streams of a device (fake_streams.h), where the
// pipelined schedule runs on streams and events (NOTE [Stream-pipelined
// step]) and the gate blocks the communicator's stream.
absl::Status RunGatedStep(StepSchedule schedule, bool on_streams = false) {
  MUONSHARD_ASSIGN_OR_RETURN(
      v1::Plan plan, BuildPlan(muonshard::testing::DenseManifest(4, 64, 96, 80), 2, 1, PolicyKind::kBalanced, 1));
  if (plan.groups_size() != 1) return absl::InternalError("the test needs one group");
  const int group = plan.groups(0).id();
  int gated_ranks = 0;
  for (int r = 0; r < 2; ++r) gated_ranks += GateFor(plan, group, r).satisfiable ? 1 : 0;
  if (gated_ranks == 0) return absl::InternalError("no rank updates a bucket before its last reduction");
  InProcessOptions o;
  o.timeout = absl::Seconds(10);
  MUONSHARD_ASSIGN_OR_RETURN(PlanComms comms, CreateInProcessPlanComms(plan, o));
  SyntheticWorkload workload;
  std::vector<absl::Status> results = RunRanksStatus(2, [&](int rank) -> absl::Status {
    std::atomic<int> updates{0};
    const GateSpec gate = GateFor(plan, group, rank);
    GatedCommunicator gated(comms.by_rank[rank].at(group), &updates, gate.satisfiable ? gate.reductions - 1 : -1,
                            absl::Seconds(3));
    ShardedOptimizer::CommGroups groups{{group, &gated}};
    StreamedRank device({});
    std::unique_ptr<kernels::KernelBackend> backend = std::make_unique<CountingCpuBackend>(&updates);
    if (on_streams) {
      device.Defer(&groups);
      backend = device.Backend(std::make_unique<CountingCpuBackend>(&updates, std::make_unique<FakeDeviceBackend>()));
    }
    MUONSHARD_ASSIGN_OR_RETURN(v1::RankView view, planner::ExtractRankView(plan, rank));
    StepOptions step;
    step.schedule = schedule;
    MUONSHARD_ASSIGN_OR_RETURN(auto optimizer, ShardedOptimizer::Create(view, groups, backend.get(), {}, step));
    MUONSHARD_RETURN_IF_ERROR(InitializeParameters(workload, *optimizer));
    return TrainStep(workload, *optimizer, 0).status();
  });
  // The gated rank's own error first (its peer sees the abort).
  for (const absl::Status& s : results) {
    if (s.code() == absl::StatusCode::kDeadlineExceeded) return s;
  }
  for (const absl::Status& s : results) MUONSHARD_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

TEST(PipelineOverlapTest, LastReduceWaitingForAnUpdate_CompletesOnlyWhenPipelined) {
  EXPECT_THAT(RunGatedStep(StepSchedule::kPipelined), IsOk());
  // The same dependency deadlocks the sequential step (every update waits
  // for every reduce): the gate gives up.
  EXPECT_THAT(RunGatedStep(StepSchedule::kSequential),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("gated reduction")));
}

TEST(PipelineOverlapTest, OnADevicesStreams_LastReduceWaitingForAnUpdate_CompletesOnlyWhenPipelined) {
  EXPECT_THAT(RunGatedStep(StepSchedule::kPipelined, /*on_streams=*/true), IsOk());
  EXPECT_THAT(RunGatedStep(StepSchedule::kSequential, /*on_streams=*/true),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("gated reduction")));
}

// NOTE [Batched Muon]: the per-expert 2-D matrices a rank owns in one bucket
// go through one MuonUpdateBatch; the bits are the reference's (per-matrix
// MuonUpdate), which the equivalence suites check for every plan.
TEST(BatchedMuonTest, SameShapeMatricesOfABucket_GoThroughOneBatchedCall) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan,
                                 BuildPlan(muonshard::testing::MoeManifest(2, 64, 32, 8, 80), 1, 1, PolicyKind::kSeed));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, planner::ExtractRankView(plan, 0));
  std::atomic<int> updates{0};
  CountingCpuBackend backend(&updates);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto optimizer, ShardedOptimizer::Create(view, {}, &backend, {}));
  SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK(InitializeParameters(workload, *optimizer));
  MUONSHARD_ASSERT_OK(TrainStep(workload, *optimizer, 0).status());
  EXPECT_GE(backend.largest_batch, 8);  // at least one projection of all 8 experts of a layer
}

// NOTE [Muon batches]: the sequential step batches a rank's same-shape
// matrices across its buckets, each batch within muon_batch_mib (a tensor
// alone may exceed it); 0 keeps a bucket's at a time. The bits are the
// reference's under every setting (the equivalence suites run the default).
TEST(BatchedMuonTest, SequentialStep_BatchesAcrossBuckets_WithinTheLimit) {
  // 4 layers of 8 experts' 256 x 128 matrices (128 KiB of fp32 each) in
  // 1 MB buckets: 22 batched calls bucket by bucket (64 + 32 matrices).
  MUONSHARD_ASSERT_OK_AND_ASSIGN(
      v1::Plan plan, BuildPlan(muonshard::testing::MoeManifest(4, 128, 256, 8, 80), 1, 1, PolicyKind::kSeed, 1));
  ASSERT_GT(plan.muon_buckets_size(), 4);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, planner::ExtractRankView(plan, 0));
  auto run = [&](int64_t mib) -> absl::StatusOr<std::vector<CountingCpuBackend::Batch>> {
    std::atomic<int> updates{0};
    CountingCpuBackend backend(&updates);
    StepOptions step;
    step.schedule = StepSchedule::kSequential;
    step.muon_batch_mib = mib;
    MUONSHARD_ASSIGN_OR_RETURN(auto optimizer, ShardedOptimizer::Create(view, {}, &backend, {}, step));
    SyntheticWorkload workload;
    MUONSHARD_RETURN_IF_ERROR(InitializeParameters(workload, *optimizer));
    MUONSHARD_RETURN_IF_ERROR(TrainStep(workload, *optimizer, 0).status());
    return backend.batches;
  };
  auto items = [](const std::vector<CountingCpuBackend::Batch>& batches) {
    int n = 0;
    for (const CountingCpuBackend::Batch& b : batches) n += b.items;
    return n;
  };
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const auto per_bucket, run(0));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const auto across, run(planner::kDefaultMuonBatchMib));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(const auto two_mib, run(2));
  // The step simulator prices the same calls (sim/plan_program.h).
  auto simulated = [&](int64_t mib) -> absl::StatusOr<std::multiset<int64_t>> {
    MUONSHARD_ASSIGN_OR_RETURN(sim::StepProgram program,
                               sim::BuildPlanProgram(plan, sim::Schedule::kSequential, sim::NsCalls::kWorker, mib));
    std::multiset<int64_t> matrices;
    for (const sim::StepOp& op : program.ops) {
      for (const sim::NsMatrix& call : op.matrices) matrices.insert(call.count);
    }
    return matrices;
  };
  auto worker = [](const std::vector<CountingCpuBackend::Batch>& batches) {
    std::multiset<int64_t> matrices;
    for (const CountingCpuBackend::Batch& b : batches) matrices.insert(b.items);
    return matrices;
  };
  for (const auto& [mib, batches] :
       {std::pair{int64_t{0}, &per_bucket}, std::pair{planner::kDefaultMuonBatchMib, &across},
        std::pair{int64_t{2}, &two_mib}}) {
    SCOPED_TRACE(::testing::Message() << mib << " MiB");
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::multiset<int64_t> calls, simulated(mib));
    EXPECT_EQ(calls, worker(*batches));
  }
  EXPECT_EQ(items(across), items(per_bucket));
  EXPECT_EQ(items(two_mib), items(per_bucket));
  // The experts' gate and up matrices share a shape, their down matrices
  // another (attention's two more).
  EXPECT_LT(across.size(), per_bucket.size());
  EXPECT_GE(
      std::max_element(across.begin(), across.end(), [](const auto& a, const auto& b) { return a.items < b.items; })
          ->items,
      32);
  EXPECT_LT(across.size(), two_mib.size());
  EXPECT_LT(two_mib.size(), per_bucket.size());
  for (const CountingCpuBackend::Batch& b : two_mib) {
    if (b.items > 1) {
      EXPECT_LE(b.elements, planner::MuonBatchElements(2));
    }
  }
}

TEST(BatchedMuonTest, NegativeLimit_IsRejected) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 1, 1, PolicyKind::kSeed));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, planner::ExtractRankView(plan, 0));
  std::atomic<int> updates{0};
  CountingCpuBackend backend(&updates);
  StepOptions step;
  step.muon_batch_mib = -1;
  EXPECT_THAT(ShardedOptimizer::Create(view, {}, &backend, {}, step).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("muon_batch_mib is -1")));
}

// NOTE [Part storage] on a device backend: the program writes its gradients
// into their slots in the backend's memory (as a backward pass into a CUDA
// tensor over the slot would) and hands the slots back as BackendGradients;
// the step then moves no tensor data between host and device (the fake
// counts every copy), and ends with the CPU backend's model copies, bit for
// bit, for two ranks over in-process collectives.
TEST(DevicePartStorageTest, AStepFromGradientsInTheirSlots_CopiesNothingBetweenHostAndDevice) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 2, 1, PolicyKind::kSeed));
  const SyntheticWorkload workload;
  std::vector<FakeDeviceBackend> devices(2);
  std::vector<std::unique_ptr<kernels::KernelBackend>> cpus(2);
  std::vector<std::unique_ptr<ShardedOptimizer>> on_device(2), on_cpu(2);
  std::vector<int> step_copies(2, 0);
  auto create = [&](int r, const PlanComms& comms, kernels::KernelBackend* backend,
                    std::unique_ptr<ShardedOptimizer>& out) -> absl::Status {
    MUONSHARD_ASSIGN_OR_RETURN(const v1::RankView view, planner::ExtractRankView(plan, r));
    MUONSHARD_ASSIGN_OR_RETURN(out, ShardedOptimizer::Create(view, comms.by_rank[r], backend, {}));
    return InitializeParameters(workload, *out);
  };
  auto device_step = [&](int r, int step) -> absl::Status {
    ShardedOptimizer& opt = *on_device[r];
    auto read = [&](const HeldTensor& h, absl::Span<float> out) { return opt.ReadModelCopy(h.tensor, out); };
    MUONSHARD_ASSIGN_OR_RETURN(LocalGradients local,
                               ComputeLocalGradients(workload, opt.held_tensors(), DataRank(opt), step, read));
    BackendGradientMap grads;
    for (const HeldTensor& h : opt.held_tensors()) {
      MUONSHARD_ASSIGN_OR_RETURN(const ShardedOptimizer::PartStorage slot, opt.BackendPartStorage(h.tensor));
      MUONSHARD_ASSIGN_OR_RETURN(absl::Span<const float> grad, local.grads.PartGradient(h.tensor));
      if (slot.grad_dtype != v1::FP32 || slot.numel != h.numel()) return absl::InternalError(h.spec->name());
      std::copy(grad.begin(), grad.end(), static_cast<float*>(slot.grads));  // the "backward pass"
      grads.Set(h.tensor, BackendGradient{slot.grads, kernels::ElementType::kFloat32, h.numel()});
    }
    const int64_t before = devices[r].host_copies();
    MUONSHARD_RETURN_IF_ERROR(opt.Step(grads).status());
    step_copies[r] += devices[r].host_copies() - before;
    return absl::OkStatus();
  };
  MUONSHARD_ASSERT_OK_AND_ASSIGN(PlanComms device_comms, CreateInProcessPlanComms(plan));
  for (const absl::Status& s : RunRanksStatus(2, [&](int r) -> absl::Status {
         MUONSHARD_RETURN_IF_ERROR(create(r, device_comms, &devices[r], on_device[r]));
         for (int step = 0; step < 2; ++step) MUONSHARD_RETURN_IF_ERROR(device_step(r, step));
         return absl::OkStatus();
       })) {
    MUONSHARD_ASSERT_OK(s);
  }
  // The same steps on the CPU backend, the gradients copied in as host spans.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(PlanComms cpu_comms, CreateInProcessPlanComms(plan));
  for (const absl::Status& s : RunRanksStatus(2, [&](int r) -> absl::Status {
         cpus[r] = kernels::CreateCpuKernelBackend();
         MUONSHARD_RETURN_IF_ERROR(create(r, cpu_comms, cpus[r].get(), on_cpu[r]));
         for (int step = 0; step < 2; ++step) MUONSHARD_RETURN_IF_ERROR(TrainStep(workload, *on_cpu[r], step).status());
         return absl::OkStatus();
       })) {
    MUONSHARD_ASSERT_OK(s);
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(step_copies[r], 0) << "rank " << r;
    EXPECT_EQ(devices[r].violations(), 0) << "rank " << r;
    for (const HeldTensor& h : on_cpu[r]->held_tensors()) {
      MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<float> want, on_cpu[r]->ModelCopy(h.tensor));
      MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<float> got, on_device[r]->ModelCopy(h.tensor));
      EXPECT_TRUE(BitEqual(got, want)) << "rank " << r << " " << h.spec->name();
    }
  }
}

// The parameters a program keeps in device memory of its own (an FSDP2
// shard on the GPU) get the model copies converted there in the backend: no
// host copy, each target checked.
TEST(DevicePartStorageTest, CopyModelCopiesTo_ConvertsIntoDeviceMemoryWithoutAHostCopy) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 1, 1, PolicyKind::kSeed));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, planner::ExtractRankView(plan, 0));
  FakeDeviceBackend device;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto optimizer, ShardedOptimizer::Create(view, {}, &device, {}));
  const SyntheticWorkload workload;
  MUONSHARD_ASSERT_OK(InitializeParameters(workload, *optimizer));
  MUONSHARD_ASSERT_OK(TrainStep(workload, *optimizer, 0).status());
  std::vector<kernels::BackendMemory> memory;
  std::vector<ShardedOptimizer::ModelCopyTarget> targets;
  int n = 0;
  for (const HeldTensor& h : optimizer->held_tensors()) {  // fp32 and bf16 targets, alternately
    const kernels::ElementType type = n++ % 2 == 0 ? kernels::ElementType::kFloat32 : kernels::ElementType::kBFloat16;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(kernels::BackendMemory m, device.Allocate(h.numel() * kernels::ElementBytes(type)));
    targets.push_back({h.tensor, m.get(), type, h.numel()});
    memory.push_back(std::move(m));
  }
  const int64_t copies = device.host_copies();
  MUONSHARD_ASSERT_OK(optimizer->CopyModelCopiesTo(targets));
  EXPECT_EQ(device.host_copies(), copies);
  EXPECT_EQ(device.violations(), 0);
  for (const ShardedOptimizer::ModelCopyTarget& t : targets) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const std::vector<float> want, optimizer->ModelCopy(t.tensor));
    std::vector<float> got(t.numel);
    if (t.type == kernels::ElementType::kFloat32) {
      MUONSHARD_ASSERT_OK(device.CopyToHost(t.data, got.data(), t.numel * 4));
      EXPECT_TRUE(BitEqual(got, want)) << t.tensor;
    } else {
      std::vector<kernels::Bf16Bits> words(t.numel);
      MUONSHARD_ASSERT_OK(device.CopyToHost(t.data, words.data(), t.numel * 2));
      for (int64_t i = 0; i < t.numel; ++i) {
        ASSERT_EQ(words[i], kernels::FloatToBf16(want[i])) << t.tensor << " element " << i;
      }
    }
  }
  // A host pointer, a wrong size or a tensor this rank does not hold.
  std::vector<float> host(targets[0].numel);
  ShardedOptimizer::ModelCopyTarget bad = targets[0];
  bad.data = host.data();
  bad.type = kernels::ElementType::kFloat32;
  EXPECT_THAT(optimizer->CopyModelCopiesTo({bad}), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_EQ(device.violations(), 1);
  bad = targets[0];
  --bad.numel;
  EXPECT_THAT(optimizer->CopyModelCopiesTo({bad}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("output holds")));
  bad.tensor = 100000;
  EXPECT_THAT(optimizer->CopyModelCopiesTo({bad}), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST(StepOptionsTest, OnADeviceBackend_AutoIsSequentialAndPipelinedRunsOnStreams) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, BuildPlan(StackManifest(), 1, 1, PolicyKind::kSeed));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, planner::ExtractRankView(plan, 0));
  std::unique_ptr<kernels::KernelBackend> backend = std::make_unique<FakeDeviceBackend>();
  StepOptions step;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto optimizer, ShardedOptimizer::Create(view, {}, backend.get(), {}, step));
  EXPECT_FALSE(optimizer->pipelined());
  step.schedule = StepSchedule::kPipelined;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(optimizer, ShardedOptimizer::Create(view, {}, backend.get(), {}, step));
  EXPECT_TRUE(optimizer->pipelined());
}

TEST(StepOptionsTest, Parse_NamesTheBadValue) {
  EXPECT_THAT(ParseStepSchedule("pipelined"), IsOk());
  EXPECT_THAT(ParseStepSchedule("fast").status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"fast\"")));
  EXPECT_THAT(ParseStepPhases("comm"), IsOk());
  EXPECT_THAT(ParseStepPhases("none").status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"none\"")));
}

// --- the pipeline machinery alone ---

TEST(StepPipelineTest, OpsRunInPostOrderPerLaneOnceTheirGateIsSet) {
  std::vector<int> order;
  absl::Mutex mu;
  internal::StepPipeline pipeline(1, nullptr);
  pipeline.Begin(4);
  auto record = [&](int id) {
    return [&, id] {
      absl::MutexLock lock(&mu);
      order.push_back(id);
      return absl::OkStatus();
    };
  };
  pipeline.Post(0, 0, record(1), 2, true);
  pipeline.Post(0, internal::StepPipeline::kNoEvent, record(2), 3, true);
  pipeline.Set(0, false);
  EXPECT_EQ(pipeline.NextReady().value_or(-1), 2);
  EXPECT_EQ(pipeline.NextReady().value_or(-1), 3);
  EXPECT_THAT(pipeline.Finish(), IsOk());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(StepPipelineTest, AFailedOp_SkipsTheRest_WakesTheComputeThread_AndCallsOnErrorOnce) {
  std::atomic<int> errors{0};
  std::atomic<int> ran{0};
  internal::StepPipeline pipeline(2, [&](const absl::Status&) { ++errors; });
  pipeline.Begin(2);
  pipeline.Post(
      0, internal::StepPipeline::kNoEvent, [] { return absl::AbortedError("peer gone"); }, 0, true);
  pipeline.Post(
      0, internal::StepPipeline::kNoEvent,
      [&] {
        ++ran;
        return absl::OkStatus();
      },
      1, true);
  // Gated on an event nobody sets: cancelled, not stuck.
  pipeline.Post(
      1, 1,
      [&] {
        ++ran;
        return absl::OkStatus();
      },
      internal::StepPipeline::kNoEvent, false);
  EXPECT_THAT(pipeline.NextReady().status(), StatusIs(absl::StatusCode::kAborted, ::testing::_));
  EXPECT_THAT(pipeline.Finish(), StatusIs(absl::StatusCode::kAborted, HasSubstr("peer gone")));
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(errors.load(), 1);
  // The next step starts clean.
  pipeline.Begin(1);
  pipeline.Post(
      1, internal::StepPipeline::kNoEvent,
      [&] {
        ++ran;
        return absl::OkStatus();
      },
      0, false);
  EXPECT_THAT(pipeline.Finish(), IsOk());
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace muonshard::worker::testing
