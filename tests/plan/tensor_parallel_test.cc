// Plans with tensor parallelism (plan/tensor_parallel.h).
#include "plan/tensor_parallel.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/balanced.h"
#include "plan/plan_stats.h"
#include "plan/plan_validator.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "plan/tp_rounds.h"
#include "plan/transfer.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::ManifestBuilder;
using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A dense decoder cut small, marked as Megatron splits it: `layers` layers of
// q/k/v/gate/up (column), o/down (row), norms and a replicated Muon matrix;
// hidden size `width`, the MLP twice that.
v1::ModelManifest TpModel(int layers, int64_t width = 16) {
  const int64_t w = width, half = width / 2, twice = 2 * width;
  ManifestBuilder b;
  b.Add("model.embed_tokens.weight", {64, w});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    b.Add(p + "self_attn.q_proj.weight", {w, w})
        .Add(p + "self_attn.k_proj.weight", {half, w})
        .Add(p + "self_attn.v_proj.weight", {half, w})
        .Add(p + "self_attn.o_proj.weight", {w, w})
        .Add(p + "mlp.gate_proj.weight", {twice, w})
        .Add(p + "mlp.up_proj.weight", {twice, w})
        .Add(p + "mlp.down_proj.weight", {w, twice})
        .Add(p + "mlp.mixer.weight", {w, w})  // replicated Muon
        .Add(p + "input_layernorm.weight", {w});
  }
  b.Add("model.norm.weight", {w}).Add("lm_head.weight", {64, w});
  v1::ModelManifest m = b.Build();
  for (v1::TensorSpec& t : *m.mutable_tensors()) {
    const std::string& n = t.name();
    for (const char* column : {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head"}) {
      if (n.find(column) != std::string::npos) t.set_tp_split(v1::TP_COLUMN);
    }
    if (n.find("o_proj") != std::string::npos || n.find("down_proj") != std::string::npos) {
      t.set_tp_split(v1::TP_ROW);
    }
  }
  return m;
}

v1::PlanRequest TpRequest(const v1::ModelManifest& m, int world, int tp, v1::Policy policy = v1::BALANCED,
                          v1::TpMuonMode mode = v1::TP_MUON_UNSPECIFIED) {
  v1::PlanRequest r = MakeRequest(m, world);
  r.mutable_topology()->set_tp(tp);
  r.mutable_policy()->set_policy(policy);
  r.mutable_policy()->set_tp_muon(mode);
  return r;
}

int TensorIndex(const v1::Plan& plan, const std::string& name) {
  for (int i = 0; i < plan.tensors_size(); ++i) {
    if (plan.tensors(i).name() == name) return i;
  }
  return -1;
}

TEST(TensorParallelPlanTest, ShardsGroupsAndOwnerPairs) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(TpRequest(TpModel(2), 4, 2)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  EXPECT_EQ(plan.topology().tp(), 2);
  EXPECT_EQ(plan.policy().tp_muon(), v1::TP_MUON_DISTRIBUTED);
  // DEFAULT (stage 0, tp rank t) = {t, 2 + t}; TP groups {0, 1}, {2, 3}.
  ASSERT_EQ(plan.groups_size(), 4);
  EXPECT_THAT(plan.groups(1).ranks(), ElementsAre(1, 3));
  EXPECT_EQ(plan.groups(1).tp_rank(), 1);
  EXPECT_EQ(plan.groups(3).colour(), v1::TENSOR_PARALLEL);
  EXPECT_THAT(plan.groups(3).ranks(), ElementsAre(2, 3));

  const v1::PlannedTensor& down = plan.tensors(TensorIndex(plan, "model.layers.1.mlp.down_proj.weight"));
  EXPECT_THAT(down.shape(), ElementsAre(16, 32));
  EXPECT_THAT(down.local_shape(), ElementsAre(16, 16));  // row: in / 2
  EXPECT_EQ(down.local_numel(), 256);
  EXPECT_EQ(down.parts_size(), 2);
  const v1::PlannedTensor& mixer = plan.tensors(TensorIndex(plan, "model.layers.1.mlp.mixer.weight"));
  EXPECT_EQ(mixer.local_numel(), 0);  // replicated: whole on every tp rank

  // Each split matrix: one replica's two tp ranks, one of which runs NS on
  // the whole matrix; a replicated one: NS on both copies, no TP op.
  const double whole_down = NsFlops(16, 32, plan.policy().ns_steps());
  std::map<int, std::vector<std::pair<int, const v1::OwnedTensor*>>> owners;  // tensor -> (rank, owned)
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) owners[o.tensor()].push_back({r.rank(), &o});
  }
  const auto& d = owners[TensorIndex(plan, "model.layers.1.mlp.down_proj.weight")];
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first / 2, d[1].first / 2);  // one replica
  EXPECT_EQ(d[0].second->tp_op(), v1::TP_OP_GATHER_SCATTER);
  EXPECT_EQ(d[0].second->ns_flops() + d[1].second->ns_flops(), whole_down);
  const int ns_rank = d[0].second->ns_tp_rank();
  EXPECT_EQ(d[ns_rank].second->ns_flops(), whole_down);
  EXPECT_EQ(d[ns_rank].second->tp_recv_bytes(), 256 * 4);  // the other shard, fp32
  EXPECT_EQ(d[1 - ns_rank].second->tp_send_bytes(), 256 * 4);
  const auto& mix = owners[TensorIndex(plan, "model.layers.1.mlp.mixer.weight")];
  ASSERT_EQ(mix.size(), 2u);
  for (const auto& [rank, o] : mix) {
    EXPECT_EQ(o->tp_op(), v1::TP_OP_NONE);
    EXPECT_EQ(o->ns_flops(), NsFlops(16, 16, plan.policy().ns_steps()));
    EXPECT_EQ(o->tp_send_bytes(), 0);
  }
  for (int r = 0; r < 4; ++r) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, ExtractRankView(plan, r));
    EXPECT_EQ(view.groups_size(), 2);  // its sharding group and its TP group
    EXPECT_EQ(view.rank().tp_rank(), r % 2);
  }
}

TEST(TensorParallelPlanTest, NewtonSchulzSpreadsOverTheTpRanks) {
  for (v1::Policy policy : {v1::SEED, v1::BALANCED}) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(TpRequest(TpModel(8), 8, 4, policy)));
    MUONSHARD_ASSERT_OK(ValidatePlan(plan));
    double total = 0, busiest = 0;
    for (const v1::RankPlan& r : plan.ranks()) {
      total += r.ns_flops();
      busiest = std::max(busiest, r.ns_flops());
    }
    // Every tp rank of a replica works: the busiest rank is far below a
    // replica's whole NS load (which `duplicated` puts on every tp rank).
    double replica_max = 0;
    for (int q = 0; q < 2; ++q) {
      double replica = 0;
      for (int t = 0; t < 4; ++t) replica += plan.ranks(q * 4 + t).ns_flops();
      replica_max = std::max(replica_max, replica);
    }
    EXPECT_LT(busiest, 0.4 * replica_max) << v1::Policy_Name(policy);
    EXPECT_GT(total, 0);
  }
}

TEST(TensorParallelPlanTest, DuplicatedModeRunsNsOnEveryTpRankAndMovesTpOver2TimesTheBytes) {
  const v1::ModelManifest m = TpModel(4);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan distributed, ComputePlan(TpRequest(m, 8, 4)));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan duplicated,
                                 ComputePlan(TpRequest(m, 8, 4, v1::BALANCED, v1::TP_MUON_DUPLICATED)));
  MUONSHARD_ASSERT_OK(ValidatePlan(duplicated));
  int64_t bytes_distributed = 0, bytes_duplicated = 0;
  double flops_distributed = 0, flops_duplicated = 0;
  for (int r = 0; r < 8; ++r) {
    bytes_distributed += distributed.ranks(r).tp_recv_bytes();
    bytes_duplicated += duplicated.ranks(r).tp_recv_bytes();
    EXPECT_EQ(distributed.ranks(r).tp_recv_bytes(), distributed.ranks(r).tp_send_bytes());
    flops_distributed += distributed.ranks(r).ns_flops();
    flops_duplicated += duplicated.ranks(r).ns_flops();
    for (const v1::OwnedTensor& o : duplicated.ranks(r).owned()) {
      if (o.tp_op() != v1::TP_OP_NONE) {
        EXPECT_EQ(o.tp_op(), v1::TP_OP_ALL_GATHER);
      }
    }
  }
  // Per split matrix: gather + scatter moves 2 (tp - 1) shards, an
  // all-gather tp (tp - 1): tp / 2 = 2 times as many.
  EXPECT_GT(bytes_distributed, 0);
  EXPECT_EQ(bytes_duplicated, 2 * bytes_distributed);
  EXPECT_GT(flops_duplicated, 2.5 * flops_distributed);
}

TEST(TensorParallelPlanTest, TpOneRequestsHashAsBefore) {
  const v1::ModelManifest m = TpModel(1);  // tp_split marks are part of the manifest
  v1::PlanRequest plain = MakeRequest(m, 4);
  v1::PlanRequest with_mode = plain;
  with_mode.mutable_policy()->set_tp_muon(v1::TP_MUON_DUPLICATED);  // meaningless at tp 1
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::PlanRequest a, CanonicalizeRequest(plain));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::PlanRequest b, CanonicalizeRequest(with_mode));
  EXPECT_EQ(ContentHash(a), ContentHash(b));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(plain));
  for (const v1::PlannedTensor& t : plan.tensors()) EXPECT_EQ(t.local_numel(), 0);
}

TEST(TensorParallelPlanTest, BadSplitsAreClearErrors) {
  v1::PlanRequest three = TpRequest(TpModel(1), 6, 3);
  EXPECT_THAT(ComputePlan(three), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("tp_split TP_COLUMN: dimension 0 (64) is not divisible by tp 3")));
  v1::PlanRequest bad_mode = TpRequest(TpModel(1), 4, 2);
  bad_mode.mutable_policy()->set_tp_muon(static_cast<v1::TpMuonMode>(9));
  EXPECT_THAT(ComputePlan(bad_mode), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("policy.tp_muon")));
}

// A small MoE decoder: split attention, a replicated router, `experts`
// per-expert matrices per layer (never TP-split under ep > 1) and a fused
// 3-D expert stack with its 2-D bias stack.
v1::ModelManifest TpMoeModel(int layers, int experts) {
  ManifestBuilder b;
  b.Add("model.embed_tokens.weight", {64, 16});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    b.Add(p + "self_attn.q_proj.weight", {16, 16})
        .Add(p + "self_attn.o_proj.weight", {16, 16})
        .Add(p + "mlp.gate.weight", {experts, 16});  // router: replicated
    for (int e = 0; e < experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      b.Add(x + "gate_proj.weight", {8 + 8 * (e % 3), 16}).Add(x + "down_proj.weight", {16, 8 + 8 * (e % 3)});
    }
    b.Add(p + "mlp.experts.gate_up_proj", {experts, 16, 24}).Add(p + "mlp.experts.gate_up_bias", {experts, 24});
    b.Add(p + "input_layernorm.weight", {16});
  }
  b.Add("model.norm.weight", {16}).Add("lm_head.weight", {64, 16});
  v1::ModelManifest m = b.Build();
  for (v1::TensorSpec& t : *m.mutable_tensors()) {
    const std::string& n = t.name();
    if (n.find("experts") != std::string::npos) continue;
    for (const char* column : {"q_proj", "embed_tokens", "lm_head"}) {
      if (n.find(column) != std::string::npos) t.set_tp_split(v1::TP_COLUMN);
    }
    if (n.find("o_proj") != std::string::npos) t.set_tp_split(v1::TP_ROW);
  }
  return m;
}

v1::PlanRequest TpMoeRequest(int world, int pp, int ep, int tp, v1::Policy policy) {
  v1::PlanRequest r = MakeRequest(TpMoeModel(2 * pp, 8), world, pp, ep, policy);
  r.mutable_topology()->set_tp(tp);
  return r;
}

// (owner rank, owned record) of every Muon matrix of the tensor.
std::vector<std::pair<int, const v1::OwnedTensor*>> OwnersOf(const v1::Plan& plan, int tensor) {
  std::vector<std::pair<int, const v1::OwnedTensor*>> owners;
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      if (o.tensor() == tensor) owners.push_back({r.rank(), &o});
    }
  }
  return owners;
}

// tp with ep > 1: the experts live in the tp layout's moe_sharding groups
// (ep rank = d * tp + t, so a replica's tp ranks hold different experts),
// whole and without TP ops; the dense split matrices keep their owner pairs.
TEST(TensorParallelPlanTest, ExpertsWithTpAreOwnedInTheirMoeShardingGroups) {
  struct Case {
    int world, pp, ep, tp;
  };
  for (const Case c : {Case{8, 1, 2, 2}, Case{8, 1, 4, 2}, Case{16, 2, 4, 4}, Case{16, 1, 8, 2}, Case{8, 1, 4, 4}}) {
    for (v1::Policy policy : {v1::SEED, v1::BALANCED}) {
      SCOPED_TRACE(absl::StrCat("W", c.world, " pp", c.pp, " ep", c.ep, " tp", c.tp, " ", v1::Policy_Name(policy)));
      MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(TpMoeRequest(c.world, c.pp, c.ep, c.tp, policy)));
      MUONSHARD_ASSERT_OK(ValidatePlan(plan));
      MUONSHARD_ASSERT_OK_AND_ASSIGN(RankLayout layout, RankLayout::Create(plan.topology()));
      ASSERT_EQ(plan.groups_size(), layout.num_groups());
      for (int i = 0; i < plan.tensors_size(); ++i) {
        const v1::PlannedTensor& t = plan.tensors(i);
        if (t.optimizer() != v1::MUON) continue;
        const auto owners = OwnersOf(plan, i);
        if (t.expert() >= 0) {  // 8 experts: ep rank expert / (8 / ep)
          ASSERT_EQ(owners.size(), 1u) << t.name();
          const int rank = owners[0].first;
          EXPECT_EQ(layout.EpRankOf(rank), t.expert() / (8 / c.ep)) << t.name();
          EXPECT_EQ(layout.TpRankOf(rank), layout.EpRankOf(rank) % c.tp) << t.name();
          EXPECT_EQ(owners[0].second->tp_op(), v1::TP_OP_NONE);
          EXPECT_EQ(owners[0].second->ns_flops(), NsFlops(t.shape(0), t.shape(1), plan.policy().ns_steps()));
          EXPECT_EQ(plan.groups(plan.muon_buckets(owners[0].second->bucket()).group()).colour(), v1::MOE_EXPERT);
        } else if (t.name().find("gate_up_proj") != std::string::npos) {
          int matrices = 0;
          for (const auto& [rank, o] : owners) {
            matrices += o->matrix_end() - o->matrix_begin();
            EXPECT_EQ(layout.EpRankOf(rank), o->matrix_begin() / (8 / c.ep)) << t.name();
            EXPECT_EQ(o->tp_op(), v1::TP_OP_NONE);
          }
          EXPECT_EQ(matrices, 8);
        } else if (IsTpSplit(t)) {
          ASSERT_EQ(owners.size(), static_cast<size_t>(c.tp)) << t.name();
          for (const auto& [rank, o] : owners) {
            EXPECT_EQ(rank / c.tp, owners[0].first / c.tp) << t.name();  // one replica
            EXPECT_EQ(o->tp_op(), v1::TP_OP_GATHER_SCATTER);
            EXPECT_EQ(o->ns_tp_rank(), owners[0].second->ns_tp_rank());
          }
        }
      }
      const TightBounds tight = ComputeTightBounds(plan);
      EXPECT_GE(plan.stats().max_ns_flops(), tight.ns_flops * (1 - 1e-12));
      EXPECT_GE(static_cast<double>(plan.stats().max_state_bytes()), tight.state_bytes * (1 - 1e-12));
      for (int r = 0; r < c.world; ++r) {
        MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, ExtractRankView(plan, r));
        EXPECT_EQ(view.groups_size(), 3);  // sharding, moe_sharding and TP groups
      }
    }
  }
}

// Under the seed policies every colour group is partitioned on its own, as
// Paddle does: the experts are owned as in the plan of the same world and ep
// without tp, and every tp rank's dense shards as in the replica's plan.
TEST(TensorParallelPlanTest, SeedExpertsWithTpMatchThePlanWithoutTp) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(TpMoeRequest(8, 1, 4, 2, v1::SEED)));
  v1::PlanRequest no_tp = TpMoeRequest(8, 1, 4, 1, v1::SEED);
  for (v1::TensorSpec& t : *no_tp.mutable_manifest()->mutable_tensors()) t.clear_tp_split();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan tp1, ComputePlan(no_tp));
  int experts_checked = 0;
  for (int i = 0; i < plan.tensors_size(); ++i) {
    if (plan.tensors(i).expert() < 0 && plan.tensors(i).name().find("experts.gate_up") == std::string::npos) continue;
    std::vector<std::tuple<int, int, int>> a, b;  // (rank, matrix_begin, matrix_end)
    for (const auto& [rank, o] : OwnersOf(plan, i)) a.emplace_back(rank, o->matrix_begin(), o->matrix_end());
    for (const auto& [rank, o] : OwnersOf(tp1, i)) b.emplace_back(rank, o->matrix_begin(), o->matrix_end());
    EXPECT_EQ(a, b) << plan.tensors(i).name();
    experts_checked += !a.empty();
  }
  EXPECT_GT(experts_checked, 30);
  // Expert AdamW slices (the bias stacks) too.
  for (int r = 0; r < 8; ++r) {
    std::vector<std::pair<int64_t, int64_t>> a, b;
    for (const v1::TensorSlice& s : plan.ranks(r).slices()) {
      if (plan.tensors(s.tensor()).name().find("gate_up_bias") != std::string::npos) a.push_back({s.begin(), s.end()});
    }
    for (const v1::TensorSlice& s : tp1.ranks(r).slices()) {
      if (tp1.tensors(s.tensor()).name().find("gate_up_bias") != std::string::npos) b.push_back({s.begin(), s.end()});
    }
    EXPECT_EQ(a, b) << "rank " << r;
  }
}

// The dense part's load the experts are planned around: Muon state per rank
// either way; the AdamW state as every rank's stage mean, or as each stage's
// water for the later AdamW water-filling to level.
TEST(TensorParallelPlanTest, RankPreloadCountsDenseAdamwAsStageMeanOrWater) {
  v1::Plan plan;
  plan.mutable_topology()->set_pp(2);
  plan.add_tensors()->set_dtype(v1::BF16);  // Muon state 8 B per element
  const int64_t muon[] = {10, 0, 4, 2}, state[] = {80 + 12, 12 * 3, 32 + 0, 16 + 24};
  for (int r = 0; r < 4; ++r) {
    v1::RankPlan* rp = plan.add_ranks();
    rp->set_rank(r);
    rp->set_stage(r / 2);
    rp->set_muon_numel(muon[r]);
    if (muon[r] > 0) rp->add_owned()->set_numel(muon[r]);  // of tensor 0
    rp->set_optimizer_state_bytes(state[r]);
    rp->set_ns_flops(r);
  }
  const Preload mean = RankPreload(plan, AdamwPreload::kStageMean);
  EXPECT_THAT(mean.state_bytes, ElementsAre(80 + 24, 0 + 24, 32 + 12, 16 + 12));
  EXPECT_THAT(mean.ns_flops, ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(mean.stage_water_bytes.empty());
  const Preload water = RankPreload(plan, AdamwPreload::kWater);
  EXPECT_THAT(water.state_bytes, ElementsAre(80, 0, 32, 16));
  EXPECT_THAT(water.stage_water_bytes, ElementsAre(48, 24));
  // FP32 Muon tensors keep no master (4 B per element); the AdamW rest is as
  // it was.
  plan.mutable_tensors(0)->set_dtype(v1::FP32);
  for (int r = 0; r < 4; ++r) plan.mutable_ranks(r)->set_optimizer_state_bytes(state[r] - 4 * muon[r]);
  const Preload fp32 = RankPreload(plan, AdamwPreload::kWater);
  EXPECT_THAT(fp32.state_bytes, ElementsAre(40, 0, 16, 8));
  EXPECT_THAT(fp32.stage_water_bytes, ElementsAre(48, 24));
}

// Per Muon tensor name: the sorted global ranks that own any of it.
std::map<std::string, std::vector<int>> MuonOwners(const v1::Plan& plan) {
  std::map<std::string, std::vector<int>> owners;
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) owners[plan.tensors(o.tensor()).name()].push_back(r.rank());
  }
  for (auto& [name, ranks] : owners) std::sort(ranks.begin(), ranks.end());
  return owners;
}

// How many Muon tensors have the same owners in both plans.
int SameOwners(const v1::Plan& a, const v1::Plan& b) {
  const auto x = MuonOwners(a), y = MuonOwners(b);
  int same = 0;
  for (const auto& [name, ranks] : x) {
    auto it = y.find(name);
    same += it != y.end() && it->second == ranks;
  }
  return same;
}

// Sticky re-planning with tp (what an elastic job's resize asks for): the
// dense part keeps each matrix on the replica of the rank that owned it, the
// experts on that rank. At the same world every owner stays; shrunk to the
// first ranks (whole replicas), more owners stay than planned from scratch.
TEST(TensorParallelPlanTest, StickyReplanningKeepsOwnersWithTp) {
  struct Case {
    v1::PlanRequest request;
    int smaller;
  };
  const Case cases[] = {{TpRequest(TpModel(6), 8, 2), 6}, {TpMoeRequest(16, 1, 4, 2, v1::BALANCED), 12}};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("W ", c.request.topology().world_size(), " ep ", c.request.topology().ep()));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan previous, ComputePlan(c.request));
    for (int world : {c.request.topology().world_size(), c.smaller}) {
      SCOPED_TRACE(absl::StrCat("to W ", world));
      v1::PlanRequest request = c.request;
      request.mutable_topology()->set_world_size(world);
      MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan scratch, ComputePlan(request));
      request.mutable_policy()->set_sticky_to(previous.content_hash());
      MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan * sticky_ptr, ComputePlan(request, nullptr, &previous));
      std::unique_ptr<v1::Plan> sticky(sticky_ptr);
      MUONSHARD_ASSERT_OK(ValidatePlan(*sticky));
      const int muon = static_cast<int>(MuonOwners(previous).size());
      MUONSHARD_ASSERT_OK_AND_ASSIGN(TransferSummary kept, ComputeTransfers(previous, *sticky));
      MUONSHARD_ASSERT_OK_AND_ASSIGN(TransferSummary fresh, ComputeTransfers(previous, scratch));
      if (world == c.request.topology().world_size()) {
        EXPECT_EQ(SameOwners(previous, *sticky), muon);
      } else {
        EXPECT_LT(kept.moved_bytes, fresh.moved_bytes);
      }
      EXPECT_LE(sticky->stats().max_ns_flops(), scratch.stats().max_ns_flops() * 1.10);
    }
  }
}

// Sticky to a plan of another model (here one layer fewer): the matrices
// both have keep their owners where balance allows; the rest is planned.
TEST(TensorParallelPlanTest, StickyReplanningToAnotherModelsPlanWithTp) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan previous, ComputePlan(TpRequest(TpModel(6), 8, 2)));
  v1::PlanRequest request = TpRequest(TpModel(7), 8, 2);
  request.mutable_policy()->set_sticky_to(previous.content_hash());
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan * plan, ComputePlan(request, nullptr, &previous));
  std::unique_ptr<v1::Plan> sticky(plan);
  MUONSHARD_EXPECT_OK(ValidatePlan(*sticky));
  EXPECT_GT(SameOwners(previous, *sticky), 0);
}

// The Muon owner (group rank) of every unit of `model` under the balanced
// policy on `layout`, with BalancedOptions.dense_runs = `runs`.
std::vector<int> BalancedOwners(const ResolvedModel& model, const RankLayout& layout, int runs) {
  BalancedOptions options;
  options.dense_runs = runs;
  std::vector<int> owner(model.units.size(), -1);
  for (const MuonShard& s : BalancedPartitionMuon(model, layout, options)) owner[s.unit] = s.owner;
  return owner;
}

// BalancedOptions.dense_runs on a replica (W 8, tp 2: 4 replicas): the
// gathered (TP-split) matrices, by NS FLOPs and bytes descending, are owned
// in runs of 2; placed one by one, equal matrices are spread instead.
TEST(TensorParallelPlanTest, DenseRunsOwnGatheredMatricesInRunsOfTp) {
  const v1::ModelManifest m = TpModel(4);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(RankLayout layout, RankLayout::Create(TpRequest(m, 8, 2).topology()));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ResolvedModel whole, ResolveModel(m, layout, DefaultExcludePatterns()));
  std::vector<int> all(m.tensors_size());
  for (int i = 0; i < m.tensors_size(); ++i) all[i] = i;
  const TpReplica replica = ReplicaOf(m, layout, all, whole);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(RankLayout replica_layout, RankLayout::Create(replica.topology));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(ResolvedModel model,
                                 ResolveModel(replica.manifest, replica_layout, DefaultExcludePatterns()));
  UseWholeMatricesForNs(whole, all, model);
  std::vector<int> gathered;
  int replicated = 0;
  for (int u = 0; u < static_cast<int>(model.units.size()); ++u) {
    const ResolvedTensor& t = model.tensors[model.units[u].tensor];
    if (!t.muon) continue;
    if (t.ns_rows * t.ns_cols > t.rows * t.cols) {
      gathered.push_back(u);
    } else {
      ++replicated;
    }
  }
  ASSERT_EQ(gathered.size(), 28u);  // q, k, v, o, gate, up, down per layer
  ASSERT_EQ(replicated, 4);         // the mixers
  auto size = [&](int u) {
    const ResolvedTensor& t = model.tensors[model.units[u].tensor];
    return std::make_pair(NsFlops(t.ns_rows, t.ns_cols, 5), t.rows * t.cols);
  };
  std::stable_sort(gathered.begin(), gathered.end(), [&](int a, int b) { return size(a) > size(b); });
  const std::vector<int> runs = BalancedOwners(model, replica_layout, 2);
  const std::vector<int> alone = BalancedOwners(model, replica_layout, 1);
  int split_pairs = 0;
  for (size_t k = 0; k < gathered.size(); k += 2) {
    SCOPED_TRACE(model.units[gathered[k]].tensor);
    EXPECT_GE(runs[gathered[k]], 0);
    EXPECT_EQ(runs[gathered[k]], runs[gathered[k + 1]]);
    split_pairs += alone[gathered[k]] != alone[gathered[k + 1]];
  }
  EXPECT_GT(split_pairs, 0);
}

// The NS FLOPs of a TP group's rounds as its ranks run them: per round of
// TpExchangeRoundsOf, the busiest tp rank's gathered NS, plus what every
// rank runs (sharded matrices).
double RoundsNsFlops(const v1::Plan& plan, int replica_rank, int tp) {
  const v1::RankPlan& first = plan.ranks(replica_rank * tp);
  double sum = 0;
  for (const std::vector<int>& round : TpExchangeRoundsOf(plan, first)) {
    double longest = 0;
    for (int t = 0; t < tp; ++t) {
      const v1::RankPlan& r = plan.ranks(replica_rank * tp + t);
      double load = 0;
      for (int position : round) {
        const int id = plan.muon_buckets(position + t).id();  // rank t's copy of the bucket
        for (const v1::OwnedTensor& o : r.owned()) {
          const bool exchanged = o.tp_op() == v1::TP_OP_GATHER_SCATTER || o.tp_op() == v1::TP_OP_SHARDED_NS;
          if (o.bucket() == id && exchanged) load += o.ns_flops();
        }
      }
      longest = std::max(longest, load);
    }
    sum += longest;
  }
  return sum;
}

// NOTE [TP exchange rounds]: the planner picks NS ranks round by round, and
// the rounds the worker and the simulator cut from the plan are the ones it
// planned: their sum of longest NS is what PlanNsRounds computed, from
// buckets read back from the plan here.
TEST(TensorParallelPlanTest, PlanNsRanksMakeTheRoundsThePlannerBalanced) {
  for (const v1::TpMuonMode mode : {v1::TP_MUON_DISTRIBUTED, v1::TP_MUON_SHARDED}) {
    for (const int world : {4, 8}) {
      SCOPED_TRACE(absl::StrCat(v1::TpMuonMode_Name(mode), " world ", world));
      v1::PlanRequest request = TpRequest(TpModel(8, /*width=*/512), world, 4, v1::SEED, mode);
      request.mutable_policy()->set_comm_buffer_mb(1);  // a bucket per matrix or two
      MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(request));
      MUONSHARD_ASSERT_OK(ValidatePlan(plan));
      for (int q = 0; q < world / 4; ++q) {
        const v1::RankPlan& first = plan.ranks(q * 4);
        std::vector<NsRoundBucket> buckets;
        for (const std::vector<int>& round : TpExchangeRoundsOf(plan, first)) {
          for (int position : round) {
            NsRoundBucket& b = buckets.emplace_back();
            for (int k = 0; k < first.owned_size(); ++k) {
              if (first.owned(k).bucket() != plan.muon_buckets(position).id()) continue;
              const v1::OwnedTensor& o = first.owned(k);
              if (o.tp_op() == v1::TP_OP_SHARDED_NS) {
                b.covers_all = true;
                b.every_rank += o.ns_flops();
              } else if (o.tp_op() == v1::TP_OP_GATHER_SCATTER) {
                b.gathered.emplace_back(k, plan.ranks(q * 4 + o.ns_tp_rank()).owned(k).ns_flops());
              }
            }
          }
        }
        ASSERT_GT(buckets.size(), 4u);
        double planned = 0;
        for (const NsRound& round : PlanNsRounds(buckets, 4, 16)) {
          double longest = 0;
          for (const std::vector<int>& bin : round.bins) {
            double load = 0;
            for (int k : bin) {
              for (int t = 0; t < 4; ++t) load += plan.ranks(q * 4 + t).owned(k).ns_flops();
            }
            longest = std::max(longest, load);
          }
          for (int b = round.begin; b < round.end; ++b) longest += buckets[b].every_rank;
          planned += longest;
        }
        EXPECT_DOUBLE_EQ(RoundsNsFlops(plan, q, 4), planned) << "replica rank " << q;
      }
    }
  }
}

// TP_MUON_SHARDED (NOTE [Sharded Newton-Schulz]): a matrix split along its
// long side (either side of a square one) is orthogonalised by every tp rank
// on its own shard, its Gram matrices all-reduced; k/v, split along their
// short side, are gathered as in the distributed mode.
TEST(TensorParallelPlanTest, ShardedModeRunsNsOnEveryTpRanksOwnShardOfMatricesSplitAlongTheLongSide) {
  const int tp = 4, steps = 5;
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan,
                                 ComputePlan(TpRequest(TpModel(4), 8, tp, v1::BALANCED, v1::TP_MUON_SHARDED)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  // name part -> {m, n_local} of its shards (whole: q/o 16 x 16, gate/up
  // 32 x 16 split along rows, down 16 x 32 along cols).
  const std::map<std::string, std::pair<int64_t, int64_t>> sharded = {
      {"q_proj", {16, 4}}, {"o_proj", {16, 4}}, {"gate_proj", {16, 8}}, {"up_proj", {16, 8}}, {"down_proj", {16, 8}}};
  int sharded_ops = 0, gathered_ops = 0;
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      const std::string& name = plan.tensors(o.tensor()).name();
      std::pair<int64_t, int64_t> mn{0, 0};
      for (const auto& [part, shape] : sharded) {
        if (name.find(part) != std::string::npos) mn = shape;
      }
      if (name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos) {
        EXPECT_EQ(o.tp_op(), v1::TP_OP_GATHER_SCATTER) << name;
        ++gathered_ops;
        continue;
      }
      if (mn.first == 0) {
        EXPECT_EQ(o.tp_op(), v1::TP_OP_NONE) << name;  // the replicated mixer
        continue;
      }
      ++sharded_ops;
      const double m = static_cast<double>(mn.first), n_local = static_cast<double>(mn.second);
      EXPECT_EQ(o.tp_op(), v1::TP_OP_SHARDED_NS) << name;
      EXPECT_EQ(o.ns_tp_rank(), -1) << name;
      EXPECT_EQ(o.ns_flops(), steps * (4 * m * m * n_local + 2 * m * m * m)) << name;
      // A ring all-reduce of the norm and 5 Gram matrices: 2 (tp - 1) / tp each way.
      const int64_t floats = steps * mn.first * mn.first + 1;
      EXPECT_EQ(o.tp_send_bytes(), 2 * (tp - 1) * floats * 4 / tp) << name;
      EXPECT_EQ(o.tp_recv_bytes(), o.tp_send_bytes()) << name;
    }
  }
  EXPECT_EQ(sharded_ops, 4 * 5 * tp);  // every layer's five matrices on each of its owner's tp ranks
  EXPECT_EQ(gathered_ops, 4 * 2 * tp);
  // The op is the sharded mode's only.
  plan.mutable_policy()->set_tp_muon(v1::TP_MUON_DISTRIBUTED);
  EXPECT_THAT(ValidatePlan(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("TP_OP_SHARDED_NS needs")));
}

TEST(TensorParallelPlanTest, ShardedNsOfTakesOneSplitAlongTheLongSideWithoutBlocks) {
  v1::PlannedTensor t;
  for (int64_t d : {32, 16}) t.add_shape(d);
  t.set_tp_split(v1::TP_COLUMN);
  for (int64_t d : {8, 16}) t.add_local_shape(d);  // rows split, rows >= cols
  ASSERT_TRUE(ShardedNsOf(t).has_value());
  EXPECT_TRUE(ShardedNsOf(t)->rows);
  EXPECT_EQ(ShardedNsOf(t)->m, 16);
  EXPECT_EQ(ShardedNsOf(t)->n_local, 8);
  t.set_local_shape(0, 32);
  t.set_local_shape(1, 4);  // cols split, the short side
  EXPECT_FALSE(ShardedNsOf(t).has_value());
  t.set_local_shape(0, 8);  // both split (a mesh tile)
  EXPECT_FALSE(ShardedNsOf(t).has_value());
  t.set_local_shape(1, 16);
  t.mutable_ns_blocks();  // per-block NS
  EXPECT_FALSE(ShardedNsOf(t).has_value());
}

TEST(TensorParallelPlanTest, ValidatorRejectsOwnersThatAreNotOneReplica) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(TpRequest(TpModel(1), 4, 2)));
  // Move one shard's Newton-Schulz rank on one owner only.
  for (v1::RankPlan& r : *plan.mutable_ranks()) {
    for (v1::OwnedTensor& o : *r.mutable_owned()) {
      if (o.tp_op() == v1::TP_OP_GATHER_SCATTER) {
        o.set_ns_tp_rank(1 - o.ns_tp_rank());
        EXPECT_THAT(ValidatePlan(plan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("agreeing on the op")));
        return;
      }
    }
  }
  FAIL() << "no split Muon matrix";
}

// LB* with tp: the shards' state and one NS task per whole split matrix
// over all of a stage's ranks. Without replicated Muon matrices the NS tasks
// are the tp 1 plan's; every plan's busiest rank is at or above the bounds.
TEST(TensorParallelPlanTest, TightBoundsCountShardsAndOneNsTaskPerWholeMatrix) {
  v1::ModelManifest split_only = TpModel(4);
  for (int i = split_only.tensors_size() - 1; i >= 0; --i) {
    if (split_only.tensors(i).name().find("mixer") != std::string::npos) {
      split_only.mutable_tensors()->DeleteSubrange(i, 1);
    }
  }
  for (int world : {4, 8, 16}) {
    SCOPED_TRACE(absl::StrCat("world ", world));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan tp1, ComputePlan(TpRequest(split_only, world, 1)));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan tp2, ComputePlan(TpRequest(split_only, world, 2)));
    EXPECT_DOUBLE_EQ(ComputeTightBounds(tp2).ns_flops, ComputeTightBounds(tp1).ns_flops);
    for (v1::TpMuonMode mode : {v1::TP_MUON_DISTRIBUTED, v1::TP_MUON_DUPLICATED}) {
      MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(TpRequest(TpModel(4), world, 2, v1::BALANCED, mode)));
      const TightBounds tight = ComputeTightBounds(plan);
      EXPECT_GE(plan.stats().max_ns_flops(), tight.ns_flops * (1 - 1e-12));
      EXPECT_GE(static_cast<double>(plan.stats().max_state_bytes()), tight.state_bytes * (1 - 1e-12));
    }
  }
}

}  // namespace
}  // namespace muonshard::planner
