// The worker process's pieces that need no coordinator: parameter dumps
// (file round trip, comparison, part files and their merge), metrics
// (exported names, recorded values, a checkpoint save's phase times and
// failures), the plan-view check against JoinJob with an in-memory plan
// source, option validation, the nccl backend's device choice and its
// failure without a CUDA device, and the CPU thread budget.

#include "worker/worker_runner.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/writer.h"
#include "client/plan_source.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernel_backend.h"
#include "plan/ns_batches.h"
#include "plan/plan_view.h"
#include "prometheus/text_serializer.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/http_get.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/worker/optimizer_test_util.h"
#include "worker/internal/nccl_factory.h"
#include "worker/internal/runner_util.h"
#include "worker/metrics.h"
#include "worker/param_dump.h"
#include "worker/params_file.h"
#include "worker/rank_session_options.h"

namespace muonshard::worker {
namespace {

using ::muonshard::testing::PrometheusHasFamily;
using ::muonshard::testing::PrometheusSample;
using ::muonshard::testing::StatusIs;
using ::muonshard::testing::TempDir;
using ::testing::HasSubstr;

ParamsFile TwoTensors() {
  ParamsFile f;
  f.tensors.push_back({"a.weight", {2, 3}, {1, -2, 3, -4, 5, -6}});
  f.tensors.push_back({"b.bias", {4}, {0.5f, 0, -0.25f, 1e-30f}});
  f.tensors.push_back({"empty", {0, 3}, {}});
  f.metadata = {{"steps", "3"}, {"source", "reference"}};
  return f;
}

TEST(ParamsFileTest, WriteRead_RoundTripsValuesShapesAndMetadata) {
  TempDir dir;
  const ParamsFile f = TwoTensors();
  MUONSHARD_ASSERT_OK(WriteParamsFile(dir.Join("p.safetensors"), f));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile back, ReadParamsFile(dir.Join("p.safetensors")));
  ASSERT_EQ(back.tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.tensors[i].name, f.tensors[i].name);
    EXPECT_EQ(back.tensors[i].shape, f.tensors[i].shape);
    EXPECT_EQ(back.tensors[i].values, f.tensors[i].values);
  }
  EXPECT_EQ(back.metadata, f.metadata);
}

TEST(ParamsFileTest, Write_ValuesDisagreeWithShape_InvalidArgumentNamingTensor) {
  TempDir dir;
  ParamsFile f;
  f.tensors.push_back({"x", {2, 2}, {1, 2, 3}});
  EXPECT_THAT(WriteParamsFile(dir.Join("p"), f), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"x\"")));
}

TEST(ParamsFileTest, Read_NotSafetensorsOrMissing_DataLossOrNotFound) {
  TempDir dir;
  std::ofstream(dir.Join("junk"), std::ios::binary) << "this is not a safetensors file at all";
  EXPECT_THAT(ReadParamsFile(dir.Join("junk")), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("junk")));
  EXPECT_THAT(ReadParamsFile(dir.Join("missing")), StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
}

TEST(CompareParamsTest, Identical_BitIdenticalAndOk) {
  const ParamsComparison c = CompareParams(TwoTensors(), TwoTensors(), 0);
  EXPECT_TRUE(c.ok());
  EXPECT_TRUE(c.bit_identical());
  EXPECT_EQ(c.failed(), 0);
}

TEST(CompareParamsTest, ErrorRelativeToTensorScale_ComparedWithRtol) {
  ParamsFile a = TwoTensors();
  // 6e-5 off on a tensor of scale 6: relative 1e-5.
  a.tensors[0].values[1] += 6e-5f;
  const ParamsComparison loose = CompareParams(a, TwoTensors(), 2e-5);
  EXPECT_TRUE(loose.ok());
  EXPECT_FALSE(loose.bit_identical());
  ASSERT_NE(loose.worst(), nullptr);
  EXPECT_EQ(loose.worst()->name, "a.weight");
  EXPECT_NEAR(loose.worst()->rel, 1e-5, 1e-6);
  const ParamsComparison tight = CompareParams(a, TwoTensors(), 5e-6);
  EXPECT_FALSE(tight.ok());
  EXPECT_EQ(tight.failed(), 1);
}

TEST(CompareParamsTest, NaN_FailsEvenWithLargeRtol) {
  ParamsFile a = TwoTensors();
  a.tensors[1].values[0] = std::nanf("");
  EXPECT_FALSE(CompareParams(a, TwoTensors(), 1e9).ok());
}

TEST(CompareParamsTest, MissingExtraShapeAndRunMetadata_AreMismatches) {
  ParamsFile a = TwoTensors();
  a.tensors[0].shape = {3, 2};
  a.tensors.pop_back();
  a.tensors.push_back({"extra", {1}, {0}});
  a.metadata["steps"] = "4";
  a.metadata["source"] = "sharded";  // not a run property: may differ
  const ParamsComparison c = CompareParams(a, TwoTensors(), 1);
  EXPECT_FALSE(c.ok());
  EXPECT_THAT(c.mismatches,
              ::testing::UnorderedElementsAre(HasSubstr("\"a.weight\": shape"), HasSubstr("\"empty\" is missing"),
                                              HasSubstr("\"extra\" is missing"), HasSubstr("\"steps\" differs")));
}

// Part files of a plan with fused expert stacks split by expert
// parallelism: the lowest rank of each group writes its group's parts, and
// the merge restores every tensor whole.
class ParamDumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(
        plan_, testing::BuildPlan(testing::StackManifest(), /*world=*/4, /*ep=*/2, testing::PolicyKind::kSeed));
  }

  // Rank r's held parts with values = tensor index + element index / 1000.
  void PartsOf(int rank, v1::RankView* view, std::vector<HeldTensor>* held, std::map<int, std::vector<float>>* m) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(*view, planner::ExtractRankView(plan_, rank));
    for (int index = 0; index < plan_.tensors_size(); ++index) {
      const v1::PlannedTensor& t = plan_.tensors(index);
      for (const v1::TensorPart& p : t.parts()) {
        const v1::CommGroup& g = plan_.groups(p.group());
        if (std::find(g.ranks().begin(), g.ranks().end(), rank) == g.ranks().end()) continue;
        held->push_back({index, &t, p.group(), p.element_begin(), p.element_end()});
        std::vector<float>& v = (*m)[index];
        for (int64_t i = p.element_begin(); i < p.element_end(); ++i) v.push_back(index + i / 1000.0f);
      }
    }
  }

  v1::Plan plan_;
};

TEST_F(ParamDumpTest, RankPartsThenMerge_RestoresEveryTensorWhole) {
  std::vector<ParamsFile> parts;
  int writers = 0;
  for (int r = 0; r < plan_.ranks_size(); ++r) {
    v1::RankView view;
    std::vector<HeldTensor> held;
    std::map<int, std::vector<float>> masters;
    PartsOf(r, &view, &held, &masters);
    if (!WritesParts(view, held)) continue;
    ++writers;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile f, RankParts(view, held, masters));
    parts.push_back(std::move(f));
  }
  // Rank 0 writes the sharding group's tensors and ep rank 0's stack parts;
  // ep rank 1's moe_sharding group has its own lowest rank.
  EXPECT_EQ(writers, 2);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile merged, MergeParts(plan_, parts));
  ASSERT_EQ(static_cast<int>(merged.tensors.size()), plan_.tensors_size());
  for (int i = 0; i < plan_.tensors_size(); ++i) {
    const ParamTensor& t = merged.tensors[i];
    EXPECT_EQ(t.name, plan_.tensors(i).name());
    ASSERT_EQ(static_cast<int64_t>(t.values.size()), plan_.tensors(i).numel());
    for (int64_t e = 0; e < plan_.tensors(i).numel(); e += 97) EXPECT_EQ(t.values[e], i + e / 1000.0f);
  }
}

TEST_F(ParamDumpTest, Merge_MissingPart_InvalidArgumentNamingTensor) {
  v1::RankView view;
  std::vector<HeldTensor> held;
  std::map<int, std::vector<float>> masters;
  PartsOf(0, &view, &held, &masters);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ParamsFile rank0, RankParts(view, held, masters));
  EXPECT_THAT(MergeParts(plan_, {rank0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is in no part file")));
  EXPECT_THAT(MergeParts(plan_, {rank0, rank0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("written twice")));
}

void SetAPlanWithACapacity(WorkerMetrics& metrics) {
  v1::RankView view;
  view.mutable_rank()->mutable_memory()->set_capacity_bytes(1 << 30);
  metrics.SetPlan(view, 1, 1);
}

TEST(WorkerMetricsTest, Registry_ExportsExactlyTheListedFamiliesWithJobAndRank) {
  WorkerMetrics metrics("j1", 3);
  SetAPlanWithACapacity(metrics);  // the headroom gauge exists only then
  std::set<std::string> names;
  for (const auto& family : metrics.registry()->Collect()) {
    names.insert(family.name);
    for (const auto& m : family.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& l : m.label) labels[l.name] = l.value;
      EXPECT_EQ(labels["job"], "j1") << family.name;
      EXPECT_EQ(labels["rank"], "3") << family.name;
      for (const auto& [k, v] : labels) {
        EXPECT_THAT(k, ::testing::AnyOf("job", "rank", "phase", "op", "term")) << family.name;
      }
    }
  }
  EXPECT_EQ(names, std::set<std::string>(std::begin(kWorkerExportedMetrics), std::end(kWorkerExportedMetrics)));
}

TEST(WorkerMetricsTest, RecordStep_AccumulatesBytesFlopsStepsAndPhases) {
  WorkerMetrics metrics("j", 0);
  StepStats stats;
  stats.reduce_seconds = 0.002;
  stats.muon_seconds = 0.004;
  stats.comm.grad_reduce = 100;
  stats.comm.grad_reduce_scatter = 200;
  stats.comm.param_broadcast = 300;
  stats.comm.param_all_gather = 400;
  metrics.RecordStep(stats, /*loss=*/1.5, /*ns_flops=*/1e6, /*train_step_seconds=*/0.01);
  metrics.RecordStep(stats, /*loss=*/1.25, /*ns_flops=*/1e6, /*train_step_seconds=*/0.01);
  metrics.SetOptimizerStateBytes(4096);
  SetAPlanWithACapacity(metrics);
  const std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_steps_total"), 2);
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_loss"), 1.25);
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_ns_flops_total"), 2e6);
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_optimizer_state_bytes"), 4096);
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_comm_bytes_total", {{"op", "reduce"}}), 200);
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_comm_bytes_total", {{"op", "reduce_scatter"}}), 400);
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_comm_bytes_total", {{"op", "broadcast"}}), 600);
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_comm_bytes_total", {{"op", "all_gather"}}), 800);
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_step_seconds_count", {{"phase", "orthogonalise"}}), 2);
  EXPECT_NEAR(*PrometheusSample(text, "muonshard_worker_step_seconds_sum", {{"phase", "orthogonalise"}}), 0.008, 1e-12);
  for (const char* name : kWorkerExportedMetrics) EXPECT_TRUE(PrometheusHasFamily(text, name)) << name;
}

TEST(WorkerMetricsTest, SetPlan_ExportsTheRanksMemoryByTermAndHeadroomOnlyWithACapacity) {
  WorkerMetrics metrics("j", 0);
  v1::RankView view;
  v1::RankMemory& m = *view.mutable_rank()->mutable_memory();
  m.set_model_bytes(10);
  m.set_grad_bytes(20);
  m.set_master_bytes(30);
  m.set_muon_momentum_bytes(40);
  m.set_adamw_moment_bytes(50);
  m.set_comm_buffer_bytes(60);
  m.set_ns_workspace_bytes(70);
  m.set_total_bytes(280);
  metrics.SetPlan(view, 1, 1);
  std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  const std::pair<const char*, double> terms[] = {{"model", 10},         {"grad", 20},         {"master", 30},
                                                  {"muon_momentum", 40}, {"adamw_moment", 50}, {"comm_buffer", 60},
                                                  {"ns_workspace", 70},  {"total", 280}};
  for (const auto& [term, bytes] : terms) {
    EXPECT_EQ(PrometheusSample(text, "muonshard_worker_plan_memory_bytes", {{"term", term}}), bytes) << term;
  }
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_plan_memory_headroom_bytes"), std::nullopt);
  m.set_capacity_bytes(1000);
  m.set_headroom_bytes(720);
  metrics.SetPlan(view, 2, 1);
  text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_plan_memory_headroom_bytes"), 720);
  m.clear_capacity_bytes();
  metrics.SetPlan(view, 3, 1);
  text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_plan_memory_headroom_bytes"), std::nullopt);
}

// A phase of a save that takes `d` on `clock` and succeeds.
std::function<absl::Status()> Takes(::muonshard::testing::FakeClock& clock, absl::Duration d) {
  return [&clock, d] {
    clock.Advance(d);
    return absl::OkStatus();
  };
}

// NOTE [Step agreement] (worker/internal/runner_util.h).
TEST(StepAgreementTest, StatesStepOptionsAndHyperParameters_AutoResolvedByBackend) {
  RankSessionOptions o;
  o.step_piece_kib = 64;
  o.buddy_every = 5;
  EXPECT_EQ(internal::StepAgreement(o, OptimizerConfig()),
            "--backend=gloo --reduce-order=ring --collectives=auto --step-schedule=pipelined --step-phases=all "
            "--step-piece-kib=64 --buddy-every=5 lr=0.0199999996 weight_decay=0.00999999978 muon_momentum=0.949999988 "
            "nesterov=true "
            "ns_steps=5 ns_coefficients=3.44449997/-4.7750001/2.0315001 ns_eps=9.99999972e-10 "
            "ns_precision=default muon_scale_version=1 muon_extra_scale=0.200000003 adamw_betas=0.899999976,"
            "0.949999988 adamw_eps=9.99999972e-10");
  o.backend = "nccl";
  EXPECT_THAT(internal::StepAgreement(o, OptimizerConfig()), HasSubstr("--step-schedule=sequential"));
  // auto and what it resolves to agree.
  RankSessionOptions automatic;
  RankSessionOptions pipelined;
  pipelined.step_schedule = "pipelined";
  MUONSHARD_EXPECT_OK(internal::CheckStepAgreement(
      {internal::StepAgreement(automatic, OptimizerConfig()), internal::StepAgreement(pipelined, OptimizerConfig())}));
  // Flat and node-first collectives would not pair up (NOTE [Node-local collectives]).
  RankSessionOptions flat;
  flat.collectives = "flat";
  EXPECT_THAT(internal::CheckStepAgreement({internal::StepAgreement(automatic, OptimizerConfig()),
                                            internal::StepAgreement(flat, OptimizerConfig())}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--collectives")));
}

TEST(StepAgreementTest, OneRankDiffers_InvalidArgumentNamingRankFlagAndBothValues) {
  RankSessionOptions same;
  RankSessionOptions other;
  other.step_piece_kib = 256;
  const std::string a = internal::StepAgreement(same, OptimizerConfig());
  const std::string b = internal::StepAgreement(other, OptimizerConfig());
  // Every rank reads the same statements and fails alike, with one message
  // (NOTE [Job failure]): the lowest rank that differs from rank 0.
  EXPECT_THAT(internal::CheckStepAgreement({a, a, b, a}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("step options differ across ranks: rank 2 runs --step-piece-kib=\"256\" where rank 0 "
                                 "runs --step-piece-kib=0")));
  EXPECT_THAT(internal::CheckStepAgreement({b, a, b, a}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1 runs --step-piece-kib=\"0\" where rank 0 runs --step-piece-kib=256")));
  // An older worker (no statement) at rank 0: compared against rank 1.
  EXPECT_THAT(
      internal::CheckStepAgreement({"", a, b}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2 runs --step-piece-kib=\"256\" where rank 1")));
  MUONSHARD_EXPECT_OK(internal::CheckStepAgreement({a, a, a, a}));
}

// The hyper-parameters: each rank updates what it owns with its own.
TEST(StepAgreementTest, HyperParametersDiffer_InvalidArgumentNamingTheValue) {
  OptimizerConfig other;
  other.lr = 0.01f;
  const std::string a = internal::StepAgreement(RankSessionOptions(), OptimizerConfig());
  const std::string b = internal::StepAgreement(RankSessionOptions(), other);
  EXPECT_THAT(internal::CheckStepAgreement({a, b}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 1 runs lr=\"0.00999999978\"")));
  OptimizerConfig quintic;
  quintic.ns.coefficient_set = kernels::NsCoefficientSet::kQuintic;
  EXPECT_THAT(internal::CheckStepAgreement({a, internal::StepAgreement(RankSessionOptions(), quintic)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ns_coefficients")));
  // The same schedule given as custom coefficients agrees.
  OptimizerConfig custom;
  custom.ns.coefficient_set = kernels::NsCoefficientSet::kCustom;
  custom.ns.custom_coefficients = kernels::BuiltinNsCoefficients(kernels::NsCoefficientSet::kSimple);
  MUONSHARD_EXPECT_OK(internal::CheckStepAgreement({a, internal::StepAgreement(RankSessionOptions(), custom)}));
}

TEST(StepAgreementTest, UnstatedOrForeignFlags_SkippedOrNamedBounded) {
  const std::string mine = internal::StepAgreement(RankSessionOptions(), OptimizerConfig());
  // An older worker states nothing: not checked.
  MUONSHARD_EXPECT_OK(internal::CheckStepAgreement({mine, ""}));
  EXPECT_THAT(internal::CheckStepAgreement({mine, "--backend=gloo"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 1 does not state --reduce-order")));
  const std::string foreign = mine + " --" + std::string(5000, 'x') + "=1";
  const absl::Status s = internal::CheckStepAgreement({mine, foreign});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("which rank 0 does not know")));
  EXPECT_LT(s.message().size(), 400u);
}

TEST(StepAgreementTest, StoreExchange_ReturnsEveryRanksValueByRank) {
  InMemoryRendezvousStore store;
  std::vector<absl::StatusOr<std::vector<std::string>>> got(3, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      got[r] = internal::StoreExchange(store, "group", r, 3, absl::StrCat("value ", r), absl::Seconds(20));
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    MUONSHARD_ASSERT_OK(got[r].status());
    EXPECT_EQ(*got[r], (std::vector<std::string>{"value 0", "value 1", "value 2"})) << "rank " << r;
  }
}

TEST(TimedCheckpointSaveTest, Success_SetsTheTimestampAndTimesEachPhase) {
  WorkerMetrics metrics("j", 0);
  ::muonshard::testing::FakeClock clock(absl::FromUnixSeconds(1'700'000'000));
  MUONSHARD_ASSERT_OK(internal::TimedCheckpointSave({{kCheckpointWrite, Takes(clock, absl::Milliseconds(20))},
                                                     {kCheckpointBarrier, Takes(clock, absl::Milliseconds(5))},
                                                     {kCheckpointCommit, Takes(clock, absl::Milliseconds(40))}},
                                                    clock, metrics));
  const std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  EXPECT_NEAR(*PrometheusSample(text, "muonshard_worker_checkpoint_last_success_timestamp_seconds"), 1'700'000'000.065,
              1e-6);
  const std::pair<const char*, double> expected[] = {{"write", 0.02}, {"barrier", 0.005}, {"commit", 0.04}};
  for (const auto& [phase, seconds] : expected) {
    EXPECT_EQ(PrometheusSample(text, "muonshard_worker_checkpoint_seconds_count", {{"phase", phase}}), 1) << phase;
    EXPECT_NEAR(*PrometheusSample(text, "muonshard_worker_checkpoint_seconds_sum", {{"phase", phase}}), seconds, 1e-9)
        << phase;
  }
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_checkpoint_failures_total"), 0);
}

// The write phase really writes a rank file, into a directory that cannot
// be created (its parent is a regular file).
TEST(TimedCheckpointSaveTest, UnwritableDirectory_CountsAFailureAndStopsTheSave) {
  TempDir tmp;
  std::ofstream(tmp.Join("file")) << "not a directory";
  const checkpoint::RankFileTarget target{tmp.Join("file/ckpt"), 1, "hash", 0, 1, "generation-1"};
  WorkerMetrics metrics("j", 0);
  ::muonshard::testing::FakeClock clock;
  bool committed = false;
  const absl::Status saved = internal::TimedCheckpointSave(
      {{kCheckpointWrite, [&] { return checkpoint::WriteRankFile(target, {}, checkpoint::Scalars{}).status(); }},
       {kCheckpointCommit,
        [&] {
          committed = true;
          return absl::OkStatus();
        }}},
      clock, metrics);
  EXPECT_FALSE(saved.ok());
  EXPECT_FALSE(committed);
  const std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_checkpoint_failures_total"), 1);
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_checkpoint_last_success_timestamp_seconds"), 0);
  EXPECT_EQ(PrometheusSample(text, "muonshard_worker_checkpoint_seconds_count", {{"phase", "write"}}), 0);
}

// JoinJob's answer for `plan` stored as version 1 of an in-memory source.
client::JoinedJob JoinedFor(const v1::Plan& plan, int rank) {
  client::JoinedJob j;
  j.job = "j";
  j.rank = rank;
  j.world_size = plan.ranks_size();
  j.plan_version = 1;
  j.content_hash = plan.content_hash();
  return j;
}

TEST(FetchJoinedViewTest, MatchingHashAndRank_ReturnsTheRanksView) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan,
                                 testing::BuildPlan(testing::StackManifest(), 4, 2, testing::PolicyKind::kBalanced));
  client::InMemoryPlanSource source;
  ASSERT_EQ(source.Add(plan), 1);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, client::FetchJoinedView(source, JoinedFor(plan, 2)));
  EXPECT_EQ(view.rank().rank(), 2);
  EXPECT_EQ(view.content_hash(), plan.content_hash());
}

TEST(FetchJoinedViewTest, ViewOfAnotherPlan_FailedPreconditionNamingBothHashes) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan seed,
                                 testing::BuildPlan(testing::StackManifest(), 4, 2, testing::PolicyKind::kSeed));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan balanced,
                                 testing::BuildPlan(testing::StackManifest(), 4, 2, testing::PolicyKind::kBalanced));
  ASSERT_NE(seed.content_hash(), balanced.content_hash());
  client::InMemoryPlanSource source;
  source.Add(balanced);  // version 1 holds another plan than the job runs
  EXPECT_THAT(client::FetchJoinedView(source, JoinedFor(seed, 0)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr(seed.content_hash()), HasSubstr(balanced.content_hash()))));
}

TEST(FetchJoinedViewTest, UnknownVersion_NotFound) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan,
                                 testing::BuildPlan(testing::StackManifest(), 4, 2, testing::PolicyKind::kSeed));
  client::InMemoryPlanSource source;
  source.Add(plan);
  client::JoinedJob j = JoinedFor(plan, 0);
  j.plan_version = 7;
  EXPECT_THAT(client::FetchJoinedView(source, j), StatusIs(absl::StatusCode::kNotFound, HasSubstr("7")));
}

TEST(WorkerOptionsTest, Validate_NamesTheFlag) {
  WorkerOptions o;
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--job")));
  o.job = "j";
  MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o));
  o.backend = "mpi";
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--backend")));
  o.backend = "gloo";
  o.workload = "mnist";
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--workload")));
  o.workload = "synthetic";
  o.lr = -1;
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--lr")));
  o.lr = 0.02f;
  o.reference = true;
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--dump-params")));
}

// NOTE [Recovery]: a restarted process must restore what its peers restore,
// and an elastic job restores under a new plan from its checkpoints.
TEST(WorkerOptionsTest, RecoveryFlags_CombinationsThatCannotRecoverNameTheFlag) {
  WorkerOptions o;
  o.job = "j";
  o.max_restarts = -1;
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-restarts")));
  o.max_restarts = 3;
  MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o));  // no checkpoints: a recovery starts from step 0
  o.checkpoint_dir = "/ckpt";
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--resume")));
  o.resume = true;
  MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o));
  o.min_workers = 2;
  MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o));
  o.checkpoint_dir.clear();
  o.resume = false;
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--min-workers")));
  o.min_workers = -1;
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--min-workers")));
  o.min_workers = 0;
  o.rejoin_grace = absl::Seconds(-1);
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--rejoin-grace")));
  o.rejoin_grace = absl::ZeroDuration();
  o.checkpoint_keep = -1;
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--checkpoint-keep")));
}

TEST(WorkerOptionsTest, NcclFlags_ValidOnlyWithTheNcclBackend) {
  WorkerOptions o;
  o.job = "j";
  o.backend = "nccl";
  MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o));
  o.cuda_device = 1;
  MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o));
  // RankOrderCommunicator wraps host-memory communicators only.
  o.reduce_order = "rank";
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--reduce-order")));
  o.reduce_order = "ring";
  o.cuda_device = -2;
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--cuda-device")));
  o.backend = "gloo";
  o.cuda_device = 0;
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--cuda-device")));
  o.cuda_device = -1;
  o.reduce_order = "rank";
  MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o));
}

TEST(WorkerOptionsTest, StepPieceKib_ZeroOrMore) {
  WorkerOptions o;
  o.job = "j";
  for (int kib : {0, 1, 4096}) {
    o.step_piece_kib = kib;
    MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o)) << kib;
  }
  o.step_piece_kib = -1;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--step-piece-kib: -1")));
}

// NOTE [Muon batches]: the flag reaches the step options.
TEST(WorkerOptionsTest, MuonBatchMib_ZeroOrMore) {
  WorkerOptions o;
  o.job = "j";
  EXPECT_EQ(o.muon_batch_mib, planner::kDefaultMuonBatchMib);
  for (int mib : {0, 1, 8192}) {
    o.muon_batch_mib = mib;
    MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o)) << mib;
    MUONSHARD_ASSERT_OK_AND_ASSIGN(const StepOptions step, StepOptionsOf(o));
    EXPECT_EQ(step.muon_batch_mib, mib);
  }
  o.muon_batch_mib = -1;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--muon-batch-mib: -1 is not >= 0")));
}

TEST(WorkerOptionsTest, StepTraceSteps_OneOrMore) {
  WorkerOptions o;
  o.job = "j";
  o.step_trace_dir = "/tmp/trace";
  MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o));
  o.step_trace_steps = 0;
  EXPECT_THAT(ValidateWorkerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--step-trace-steps: 0")));
}

TEST(WorkerOptionsTest, NsPrecision_MapsOntoTheOptimizerConfig) {
  WorkerOptions o;
  o.job = "j";
  EXPECT_EQ(internal::MakeOptimizerConfig(o).ns.precision, kernels::MatmulPrecision::kDefault);
  o.ns_precision = "fp32";
  MUONSHARD_EXPECT_OK(ValidateWorkerOptions(o));
  EXPECT_EQ(internal::MakeOptimizerConfig(o).ns.precision, kernels::MatmulPrecision::kFp32);
  o.ns_precision = "bf16";
  EXPECT_EQ(internal::MakeOptimizerConfig(o).ns.precision, kernels::MatmulPrecision::kBf16);
  EXPECT_EQ(internal::DumpMetadata(o, "sharded", "m", "h", 1).at("ns_precision"), "bf16");
  o.ns_precision = "tf32";
  EXPECT_THAT(ValidateWorkerOptions(o), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--ns-precision")));
}

TEST(CudaDeviceForTest, ExplicitElseLocalRankModuloTheDevices) {
  WorkerOptions o;
  o.backend = "nccl";
  EXPECT_EQ(internal::CudaDeviceFor(o, std::nullopt, 4), std::nullopt);  // rank not known yet
  EXPECT_EQ(internal::CudaDeviceFor(o, 5, 4), 1);                        // one host: the job rank
  EXPECT_EQ(internal::CudaDeviceFor(o, 0, 1), 0);
  o.local_world_size = 3;  // ranks 0-2, 3-5, ... per host
  EXPECT_EQ(internal::CudaDeviceFor(o, 5, 4), 2);
  EXPECT_EQ(internal::CudaDeviceFor(o, 3, 4), 0);
  o.local_rank = 6;
  EXPECT_EQ(internal::CudaDeviceFor(o, std::nullopt, 4), 2);
  EXPECT_EQ(internal::CudaDeviceFor(o, 0, 4), 2);
  o.cuda_device = 7;  // explicit: as given, even past the devices (the backend refuses it)
  EXPECT_EQ(internal::CudaDeviceFor(o, 0, 4), 7);
}

// Without a usable CUDA device (a CPU-only build: FAILED_PRECONDITION; a
// CUDA build on a machine without a GPU: UNAVAILABLE) the worker fails at
// once with a reason, before it contacts the coordinator (an unreachable
// one here, whose retries the short join timeout would cut off anyway).
TEST(RunWorkerTest, NcclBackendWithoutCudaDevice_FailsBeforeConnectingNamingTheReason) {
  if (internal::VisibleCudaDevices().ok()) GTEST_SKIP() << "a CUDA device is present (worker_nccl_test covers it)";
  WorkerOptions o;
  o.job = "j";
  o.backend = "nccl";
  o.connection.coordinator = "127.0.0.1:1";  // never contacted
  o.join_timeout = absl::Seconds(2);
  const absl::Status s = RunWorker(o);
  EXPECT_THAT(s.code(), ::testing::AnyOf(absl::StatusCode::kFailedPrecondition, absl::StatusCode::kUnavailable)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--backend nccl needs a CUDA device")) << s;
}

TEST(RunWorkerTest, ExitCodes_FollowTheCliConvention) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), 0);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("x")), 2);
  EXPECT_EQ(ExitCodeFor(absl::FailedPreconditionError("x")), 1);
  EXPECT_EQ(ExitCodeFor(absl::AbortedError("x")), 1);
}

TEST(CpuThreadBudgetTest, CreateWithThreads_SetsOpenBlasPool) {
  const int before = openblas_get_num_threads();
  kernels::CpuBackendOptions o;
  o.threads = 1;
  std::unique_ptr<kernels::KernelBackend> backend = kernels::CreateCpuKernelBackend(o);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  o.threads = 0;  // keeps whatever is set
  backend = kernels::CreateCpuKernelBackend(o);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  openblas_set_num_threads(before);
}

}  // namespace
}  // namespace muonshard::worker
