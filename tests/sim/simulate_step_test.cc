// Plans simulated end to end (sim/simulate_step.h, sim/plan_program.h).
#include "sim/simulate_step.h"

#include <array>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/model.h"
#include "plan/ns_blocks.h"
#include "plan/planner.h"
#include "plan/tp_rounds.h"
#include "sim/cluster.h"
#include "sim/cost_model.h"
#include "sim/plan_program.h"
#include "sim/step_program.h"
#include "tests/sim/tp_decoder_manifest.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::sim {
namespace {

using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

int Index(OpKind kind) { return static_cast<int>(kind); }

v1::Plan PlanOf(const v1::PlanRequest& request) {
  absl::StatusOr<v1::Plan> plan = planner::ComputePlan(request);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : v1::Plan{};
}

v1::Plan DensePlan(int world, v1::Policy policy = v1::BALANCED) {
  return PlanOf(MakeRequest(testing::DenseManifest(4, 256, 512, 1000), world, 1, 1, policy, 1));
}

v1::Plan MoePlan(int world, int ep) {
  return PlanOf(MakeRequest(testing::MoeManifest(2, 128, 64, 8, 1000), world, 1, ep, v1::BALANCED, 1));
}

// TpDecoderManifest planned on `world` ranks with `tp` and `mode`.
v1::Plan TpPlan(int world, int tp, v1::TpMuonMode mode) {
  v1::ModelManifest m = testing::TpDecoderManifest();
  v1::PlanRequest request = MakeRequest(m, world, 1, 1, v1::BALANCED, 1);
  request.mutable_topology()->set_tp(tp);
  request.mutable_policy()->set_tp_muon(mode);
  return PlanOf(request);
}

// World 2, tp 2: four layers of column-split fp32 matrices, each shard a
// 1 MiB bucket or larger, so a rank's TP buckets form exchange rounds (an up
// projection as large as the q and k before it: one tp rank orthogonalises
// the up projection while the other does q and k).
v1::Plan TpRoundsPlan(v1::TpMuonMode mode = v1::TP_MUON_DISTRIBUTED) {
  testing::ManifestBuilder b("rounds");
  for (int l = 0; l < 4; ++l) {
    b.Add(absl::StrCat("model.layers.", l, ".self_attn.q_proj.weight"), {1024, 512}, v1::FP32)
        .Add(absl::StrCat("model.layers.", l, ".self_attn.k_proj.weight"), {1024, 512}, v1::FP32)
        .Add(absl::StrCat("model.layers.", l, ".mlp.up_proj.weight"), {4096, 512}, v1::FP32);
  }
  v1::ModelManifest m = b.Build();
  for (v1::TensorSpec& t : *m.mutable_tensors()) t.set_tp_split(v1::TP_COLUMN);
  v1::PlanRequest request = MakeRequest(m, 2, 1, 1, v1::BALANCED, 1);
  request.mutable_topology()->set_tp(2);
  request.mutable_policy()->set_tp_muon(mode);
  return PlanOf(request);
}

StepResult Simulate(const v1::Plan& plan, const ClusterSpec& cluster, Schedule schedule) {
  absl::StatusOr<StepResult> r = SimulateStep(plan, cluster, schedule);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : StepResult{};
}

// What each rank hands its collectives is what its RankPlan says.
void ExpectThePlansBytes(const v1::Plan& plan, const StepResult& r) {
  ASSERT_EQ(r.ranks.size(), static_cast<size_t>(plan.ranks_size()));
  for (const v1::RankPlan& rp : plan.ranks()) {
    const RankResult& got = r.ranks[rp.rank()];
    EXPECT_EQ(got.collective_bytes[Index(OpKind::kReduce)], rp.grad_reduce_bytes()) << "rank " << rp.rank();
    EXPECT_EQ(got.collective_bytes[Index(OpKind::kReduceScatter)], rp.grad_reduce_scatter_bytes());
    EXPECT_EQ(got.collective_bytes[Index(OpKind::kBroadcast)], rp.param_broadcast_bytes());
    EXPECT_EQ(got.collective_bytes[Index(OpKind::kAllGather)], rp.param_all_gather_bytes());
    EXPECT_EQ(got.p2p_sent_bytes, rp.tp_send_bytes());
    EXPECT_EQ(got.p2p_recv_bytes, rp.tp_recv_bytes());
  }
}

// DensePlan's model with its Muon buckets in scatter rounds (NOTE [Muon
// scatter rounds] in plan/muon_rounds.h).
v1::Plan ScatterRoundsPlan(int world, v1::Policy policy = v1::BALANCED) {
  v1::PlanRequest request = MakeRequest(testing::DenseManifest(4, 256, 512, 1000), world, 1, 1, policy, 1);
  request.mutable_policy()->set_muon_reduce(v1::MUON_REDUCE_SCATTER_ROUNDS);
  return PlanOf(request);
}

std::vector<std::pair<std::string, v1::Plan>> Plans() {
  return {{"dense seed", DensePlan(4, v1::SEED)},
          {"dense scatter rounds", ScatterRoundsPlan(4)},
          {"dense balanced", DensePlan(4)},
          {"moe ep 2", MoePlan(4, 2)},
          {"tp 2 distributed", TpPlan(4, 2, v1::TP_MUON_DISTRIBUTED)},
          {"tp 2 duplicated", TpPlan(4, 2, v1::TP_MUON_DUPLICATED)}};
}

TEST(SimulateStepTest, PipelinedIsNeverSlowerAndBytesAreThePlans) {
  for (const auto& [name, plan] : Plans()) {
    for (const char* preset : {"h200", "cpu"}) {
      for (int gpus_per_node : {8, 2}) {
        ClusterSpec c = *Preset(preset);
        c.gpus_per_node = gpus_per_node;
        SCOPED_TRACE(::testing::Message() << name << " on " << preset << ", " << gpus_per_node << " per node");
        const StepResult seq = Simulate(plan, c, Schedule::kSequential);
        const StepResult pipe = Simulate(plan, c, Schedule::kPipelined);
        EXPECT_GT(seq.step_seconds, 0);
        EXPECT_LE(pipe.step_seconds, seq.step_seconds * (1 + 1e-9));
        ExpectThePlansBytes(plan, seq);
        ExpectThePlansBytes(plan, pipe);
        // Same ops, same prices: the same busy time and wire bytes per rank,
        // but for compute that shares a CPU with collectives on the pipelined
        // schedule (NOTE [Host CPU]: the cpu preset).
        const bool shares_cpu = c.host_collective_gb_s > 0;
        for (size_t r = 0; r < seq.ranks.size(); ++r) {
          for (int ph = 0; ph < kPhaseCount; ++ph) {
            const Phase phase = static_cast<Phase>(ph);
            if (shares_cpu && (phase == Phase::kNewtonSchulz || phase == Phase::kMuonElementwise ||
                               phase == Phase::kAdamwElementwise)) {
              EXPECT_GE(pipe.ranks[r].busy_seconds[ph], seq.ranks[r].busy_seconds[ph] - 1e-12);
            } else {
              EXPECT_NEAR(seq.ranks[r].busy_seconds[ph], pipe.ranks[r].busy_seconds[ph], 1e-12);
            }
          }
          EXPECT_NEAR(seq.ranks[r].wire_bytes[1], pipe.ranks[r].wire_bytes[1], 1e-3);
        }
      }
    }
  }
}

TEST(SimulateStepTest, ScatterRoundsReduceScatterBucketsOfDistinctOwnersTogether) {
  for (const v1::Policy policy : {v1::SEED, v1::BALANCED}) {
    const v1::Plan to_owner = DensePlan(4, policy);
    const v1::Plan rounds = ScatterRoundsPlan(4, policy);
    ASSERT_EQ(rounds.muon_buckets_size(), to_owner.muon_buckets_size());
    for (const Schedule schedule : {Schedule::kSequential, Schedule::kPipelined}) {
      MUONSHARD_ASSERT_OK_AND_ASSIGN(const StepProgram a, BuildPlanProgram(to_owner, schedule));
      MUONSHARD_ASSERT_OK_AND_ASSIGN(const StepProgram b, BuildPlanProgram(rounds, schedule));
      int reduces = 0, muon_scatters = 0, gathers = 0;
      for (const StepOp& op : b.ops) {
        reduces += op.kind == OpKind::kReduce;
        muon_scatters += op.kind == OpKind::kReduceScatter && op.label.rfind("reduce_scatter M", 0) == 0;
        gathers += op.kind == OpKind::kAllGather && op.label.rfind("all_gather M", 0) == 0;
      }
      int reduces_before = 0;
      for (const StepOp& op : a.ops) reduces_before += op.kind == OpKind::kReduce;
      EXPECT_GT(muon_scatters, 0);
      EXPECT_EQ(gathers, muon_scatters);
      EXPECT_LT(reduces, reduces_before);
    }
    // A round's reduce-scatter and all-gather take less time than its
    // buckets' reduces and broadcasts, one after another.
    for (int gpus_per_node : {1, 2}) {
      ClusterSpec c = *Preset("h200");
      c.gpus_per_node = gpus_per_node;
      const StepResult owner_step = Simulate(to_owner, c, Schedule::kSequential);
      const StepResult round_step = Simulate(rounds, c, Schedule::kSequential);
      ExpectThePlansBytes(rounds, round_step);
      double before = 0, after = 0;
      for (size_t r = 0; r < owner_step.ranks.size(); ++r) {
        for (const Phase phase : {Phase::kReduce, Phase::kSync}) {
          before += owner_step.ranks[r].busy_seconds[static_cast<int>(phase)];
          after += round_step.ranks[r].busy_seconds[static_cast<int>(phase)];
        }
      }
      EXPECT_LT(after, before) << v1::Policy_Name(policy) << ", " << gpus_per_node << " per node";
    }
  }
}

TEST(SimulateStepTest, WireBytesOnOneNodeFollowTheRing) {
  // Dense, tp 1: one DEFAULT group of 4; every collective moves (n-1)/n of
  // its buffer per rank with NCCL's ring, reduce and broadcast included.
  const v1::Plan plan = DensePlan(4);
  ClusterSpec c = *Preset("h200");
  c.algorithm = Algorithm::kRing;
  const StepResult r = Simulate(plan, c, Schedule::kSequential);
  for (const v1::RankPlan& rp : plan.ranks()) {
    const double handed = static_cast<double>(rp.grad_reduce_bytes() + rp.grad_reduce_scatter_bytes() +
                                              rp.param_broadcast_bytes() + rp.param_all_gather_bytes());
    EXPECT_NEAR(r.ranks[rp.rank()].wire_bytes[0], 0.75 * handed, 1e-3 * handed);
    EXPECT_EQ(r.ranks[rp.rank()].wire_bytes[1], 0);
  }
}

TEST(SimulateStepTest, TwoNodesPutBytesOnTheNetworkAndTakeLonger) {
  const v1::Plan plan = DensePlan(4);
  ClusterSpec one = *Preset("h200");
  ClusterSpec two = one;
  two.gpus_per_node = 2;
  const StepResult a = Simulate(plan, one, Schedule::kSequential);
  const StepResult b = Simulate(plan, two, Schedule::kSequential);
  EXPECT_GT(b.step_seconds, a.step_seconds);
  EXPECT_EQ(b.ranks[3].node, 1);
  EXPECT_GT(b.ranks[0].wire_bytes[1], 0);
  EXPECT_LT(b.ranks[0].wire_bytes[1], b.ranks[0].wire_bytes[0] + b.ranks[0].wire_bytes[1]);
}

TEST(SimulateStepTest, TensorParallelBucketsExchangeOverTheirTpGroup) {
  for (v1::TpMuonMode mode : {v1::TP_MUON_DISTRIBUTED, v1::TP_MUON_DUPLICATED}) {
    const v1::Plan plan = TpPlan(4, 2, mode);
    const StepResult r = Simulate(plan, *Preset("h200"), Schedule::kPipelined);
    int exchanges = 0;
    for (const StepOp& op : r.program.ops) exchanges += op.phase == Phase::kTpExchange ? 1 : 0;
    EXPECT_GT(exchanges, 0);
    int64_t sent = 0;
    for (const v1::RankPlan& rp : plan.ranks()) sent += rp.tp_send_bytes();
    EXPECT_GT(sent, 0);
    EXPECT_GT(r.ranks[0].busy_seconds[static_cast<int>(Phase::kTpExchange)], 0);
  }
}

// NOTE [TP exchange rounds]: the program exchanges as the worker does, one
// gather and one scatter per NS rank of each round (planner::TpExchangeRoundsOf),
// the round's matrices in one block, on both schedules -- fewer gathers than
// one per NS rank of each bucket.
TEST(SimulateStepTest, TensorParallelBucketsExchangeInRounds) {
  const v1::Plan plan = TpRoundsPlan();
  // Rank 0's rounds (rank 1 has the same), the gathers they need, and what
  // one bucket at a time would need.
  int64_t gathers = 0, per_bucket = 0;
  bool joined = false;
  std::map<int, std::set<int>> roots_of_bucket;  // muon bucket id -> NS tp ranks
  for (const v1::OwnedTensor& o : plan.ranks(0).owned()) roots_of_bucket[o.bucket()].insert(o.ns_tp_rank());
  for (const std::vector<int>& round : planner::TpExchangeRoundsOf(plan, plan.ranks(0))) {
    std::set<int> roots;
    for (int bucket : round) {
      const std::set<int>& r = roots_of_bucket[plan.muon_buckets(bucket).id()];
      roots.insert(r.begin(), r.end());
      per_bucket += static_cast<int64_t>(r.size());
    }
    gathers += static_cast<int64_t>(roots.size());
    joined = joined || round.size() > 1;
  }
  ASSERT_TRUE(joined);
  ASSERT_LT(gathers, per_bucket);
  for (Schedule schedule : {Schedule::kSequential, Schedule::kPipelined}) {
    const StepResult r = Simulate(plan, *Preset("h200"), schedule);
    std::array<int64_t, kOpKindCount> ops{};
    for (const StepOp& op : r.program.ops) {
      if (op.phase == Phase::kTpExchange) ++ops[Index(op.kind)];
    }
    EXPECT_EQ(ops[Index(OpKind::kGather)], gathers) << ScheduleName(schedule);
    EXPECT_EQ(ops[Index(OpKind::kScatter)], gathers) << ScheduleName(schedule);
  }
}

// NOTE [Sharded Newton-Schulz]: with TP_MUON_SHARDED every shard is
// orthogonalised where it is; a round moves its Gram matrices and norms in
// one all-reduce over the TP group instead of gathers and scatters.
TEST(SimulateStepTest, ShardedNsAllReducesARoundsGramMatricesInsteadOfGathering) {
  const v1::Plan plan = TpRoundsPlan(v1::TP_MUON_SHARDED);
  int64_t all_reduced = 0;
  for (const v1::OwnedTensor& o : plan.ranks(0).owned()) {
    ASSERT_EQ(o.tp_op(), v1::TP_OP_SHARDED_NS);
    const std::optional<planner::ShardedNs> ns = planner::ShardedNsOf(plan.tensors(o.tensor()));
    ASSERT_TRUE(ns.has_value());
    all_reduced += (o.matrix_end() - o.matrix_begin()) * ns->AllReducedFloats(plan.policy().ns_steps()) * 4;
  }
  const int64_t rounds = static_cast<int64_t>(planner::TpExchangeRoundsOf(plan, plan.ranks(0)).size());
  ASSERT_GT(rounds, 0);
  for (Schedule schedule : {Schedule::kSequential, Schedule::kPipelined}) {
    const StepResult r = Simulate(plan, *Preset("h200"), schedule);
    std::array<int64_t, kOpKindCount> ops{};
    for (const StepOp& op : r.program.ops) {
      if (op.phase == Phase::kTpExchange) ++ops[Index(op.kind)];
    }
    EXPECT_EQ(ops[Index(OpKind::kGather)] + ops[Index(OpKind::kScatter)], 0) << ScheduleName(schedule);
    EXPECT_EQ(ops[Index(OpKind::kAllReduce)], rounds) << ScheduleName(schedule);
    for (const RankResult& rank : r.ranks) {
      EXPECT_EQ(rank.collective_bytes[Index(OpKind::kAllReduce)], all_reduced) << ScheduleName(schedule);
    }
  }
}

// StepOp::call_group: the worker issues a round's gathers as one group call
// and its scatters as another. NCCL runs each at once (priced on its first
// op: the busiest member's share), Gloo one after another: the same bytes,
// less time on NCCL.
TEST(SimulateStepTest, ARoundsGathersAreOneGroupCallThatNcclRunsAtOnce) {
  const v1::Plan plan = TpRoundsPlan();
  const ClusterSpec nccl = *Preset("h200");
  ClusterSpec gloo = nccl;
  gloo.library = CollectiveLibrary::kGloo;
  const StepResult n = Simulate(plan, nccl, Schedule::kSequential);
  const StepResult g = Simulate(plan, gloo, Schedule::kSequential);
  const int tp = static_cast<int>(Phase::kTpExchange);
  EXPECT_LT(n.ranks[0].busy_seconds[tp], g.ranks[0].busy_seconds[tp]);
  EXPECT_EQ(n.ranks[0].p2p_sent_bytes, g.ranks[0].p2p_sent_bytes);
  std::map<int, std::vector<int>> ops_of_call;
  for (size_t i = 0; i < n.program.ops.size(); ++i) {
    if (n.program.ops[i].call_group >= 0) ops_of_call[n.program.ops[i].call_group].push_back(static_cast<int>(i));
  }
  int joined = 0;
  for (const auto& [call, ops] : ops_of_call) {
    EXPECT_GT(n.timing[ops[0]].end, n.timing[ops[0]].start);
    for (size_t k = 1; k < ops.size(); ++k) {
      ++joined;
      EXPECT_EQ(n.timing[ops[k]].end, n.timing[ops[k]].start) << n.program.ops[ops[k]].label;
      EXPECT_GT(g.timing[ops[k]].end, g.timing[ops[k]].start) << g.program.ops[ops[k]].label;
    }
  }
  EXPECT_GT(joined, 0);
}

TEST(SimulateStepTest, OneRankRunsItsOpsBackToBack) {
  // World 1: no collectives, so the step is the sum of its compute.
  const v1::Plan plan = DensePlan(1);
  for (Schedule s : {Schedule::kSequential, Schedule::kPipelined}) {
    const StepResult r = Simulate(plan, *Preset("h100"), s);
    const std::array<double, kPhaseCount>& busy = r.ranks[0].busy_seconds;
    EXPECT_NEAR(r.step_seconds, std::accumulate(busy.begin(), busy.end(), 0.0), 1e-12);
    EXPECT_EQ(busy[static_cast<int>(Phase::kReduce)], 0);
    EXPECT_GT(busy[static_cast<int>(Phase::kNewtonSchulz)], 0);
  }
}

TEST(SimulateStepTest, SlowGemmPutsNewtonSchulzOnTheCriticalPath) {
  ClusterSpec c = *Preset("h200");
  c.gemm_tflops = 0.001;
  const StepResult r = Simulate(DensePlan(4), c, Schedule::kPipelined);
  EXPECT_EQ(r.critical_phase, Phase::kNewtonSchulz);
  ASSERT_FALSE(r.critical_path.empty());
  EXPECT_EQ(r.timing[r.critical_path.front()].start, 0);
  EXPECT_NEAR(r.timing[r.critical_path.back()].end, r.step_seconds, 1e-15);
}

// NOTE [Batched NS cost]: a rank's Newton-Schulz calls in a bucket are the
// worker's (NOTE [Batched Muon]): tensors of one shape together (a stack
// with stacks of its size), a blocked tensor per block shape; with bf16
// gradients one call per tensor.
TEST(SimulateStepTest, NsCallsOfABucketAreTheWorkersBatches) {
  testing::ManifestBuilder b("calls");
  for (int i = 0; i < 4; ++i) b.Add(absl::StrCat("model.layers.", i, ".mlp.down_proj.weight"), {64, 32});
  b.Add("model.layers.0.mlp.up_proj.weight", {32, 64})
      .Add("model.layers.0.self_attn.qkv_proj.weight", {96, 64})
      .Add("model.layers.0.mlp.experts.gate_up_proj", {4, 32, 64});
  v1::ModelManifest m = b.Build();
  *m.mutable_tensors(5)->mutable_ns_blocks() = *planner::ParseNsBlocks("rows:32,32,32");
  auto calls_of = [&](v1::DType grad, NsCalls ns_calls = NsCalls::kWorker) {
    v1::PlanRequest request = MakeRequest(m, 1, 1, 1, v1::BALANCED, 1);
    request.mutable_policy()->set_grad_dtype(grad);
    const v1::Plan plan = PlanOf(request);
    absl::StatusOr<StepProgram> program = BuildPlanProgram(plan, Schedule::kSequential, ns_calls);
    EXPECT_TRUE(program.ok()) << program.status();
    std::multiset<std::pair<int64_t, int64_t>> calls;  // (min_dim, matrices)
    double flops = 0;
    for (const StepOp& op : program.ok() ? program->ops : std::vector<StepOp>{}) {
      if (op.kind != OpKind::kNewtonSchulz) continue;
      for (const NsMatrix& call : op.matrices) {
        calls.insert({call.min_dim, call.count});
        flops += call.flops;
      }
    }
    EXPECT_DOUBLE_EQ(flops, plan.ranks(0).ns_flops());
    return calls;
  };
  using Calls = std::multiset<std::pair<int64_t, int64_t>>;
  // down x 4 and the stack of 4: one call each of 4; up; q | k | v: one of 3.
  EXPECT_EQ(calls_of(v1::FP32), (Calls{{32, 4}, {32, 4}, {32, 1}, {32, 3}}));
  EXPECT_EQ(calls_of(v1::BF16), (Calls{{32, 1}, {32, 1}, {32, 1}, {32, 1}, {32, 4}, {32, 1}, {32, 3}}));
  // Paddle's seed: a call per tensor at its whole matrices' smaller dimension (q | k | v as one 96 x 64).
  EXPECT_EQ(calls_of(v1::FP32, NsCalls::kPerTensor),
            (Calls{{32, 1}, {32, 1}, {32, 1}, {32, 1}, {32, 1}, {64, 1}, {32, 1}}));
  // A batched call costs less than its matrices one by one on a GPU.
  ClusterSpec h200 = *Preset("h200");
  h200.ns_call_us = 0;
  const double one = NewtonSchulzSeconds(h200, std::vector<NsMatrix>{{1e9, 32, 1}});
  EXPECT_LT(NewtonSchulzSeconds(h200, std::vector<NsMatrix>{{4e9, 32, 4}}), 4 * one);
}

TEST(SimulateStepTest, BadClustersAndPlansAreRefused) {
  const v1::Plan plan = DensePlan(4);
  ClusterSpec c = *Preset("h200");
  c.nodes = 1;
  c.gpus_per_node = 2;
  EXPECT_THAT(SimulateStep(plan, c, Schedule::kSequential),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cluster.nodes: the plan's world size 4")));
  c = *Preset("h200");
  c.inter_node.bandwidth_gb_s = -1;
  EXPECT_THAT(SimulateStep(plan, c, Schedule::kSequential),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cluster.inter_node.bandwidth_gb_s")));
  v1::Plan broken = plan;
  broken.mutable_muon_buckets(0)->set_group(99);
  EXPECT_THAT(SimulateStep(broken, *Preset("h200"), Schedule::kSequential),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("group 99 is not in the plan")));
}

TEST(SimulateStepTest, ScheduleNames) {
  EXPECT_EQ(*ParseSchedule("Pipelined"), Schedule::kPipelined);
  EXPECT_STREQ(ScheduleName(Schedule::kSequential), "sequential");
  EXPECT_THAT(ParseSchedule("eager"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"eager\"")));
}

}  // namespace
}  // namespace muonshard::sim
