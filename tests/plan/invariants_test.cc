// Invariants over many generated manifests, topologies and policies: every
// plan validates (each Muon matrix owned exactly once in its group, AdamW
// slices partitioning each tensor, aligned buckets, consistent totals), seed
// shards are equal, owners stay in their colour group, and plans are
// deterministic.
#include <tuple>

#include "gtest/gtest.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

struct Topo {
  int world, pp, ep;
};

class InvariantsTest : public ::testing::TestWithParam<std::tuple<int, v1::Policy>> {};

void ExpectSeedShardsEqual(const v1::Plan& plan) {
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    const int64_t shard = b.shard_offsets(1) - b.shard_offsets(0);
    for (int i = 0; i + 1 < b.shard_offsets_size(); ++i) {
      ASSERT_EQ(b.shard_offsets(i + 1) - b.shard_offsets(i), shard) << "bucket " << b.id();
    }
  }
}

void ExpectOwnersInTheirGroup(const v1::Plan& plan) {
  for (const v1::MuonBucket& b : plan.muon_buckets()) {
    const v1::CommGroup& g = plan.groups(b.group());
    for (const v1::BucketEntry& e : b.entries()) {
      const v1::PlannedTensor& t = plan.tensors(e.tensor());
      // Expert tensors live in MOE_EXPERT groups only when ep > 1.
      if (plan.topology().ep() > 1 && t.expert() >= 0) {
        EXPECT_EQ(g.colour(), v1::MOE_EXPERT) << t.name();
      }
      if (t.expert() < 0 && t.parts_size() == 1) {
        EXPECT_EQ(g.colour(), v1::DEFAULT) << t.name();
      }
      EXPECT_EQ(g.stage(), t.stage()) << t.name();
    }
  }
}

TEST_P(InvariantsTest, HoldOnGeneratedManifests) {
  const auto [seed, policy] = GetParam();
  const int experts = seed % 3 == 0 ? 0 : (seed % 3 == 1 ? 4 : 8);
  const v1::ModelManifest m = testing::RandomManifest(seed, 20 + seed * 7 % 150, experts);
  const Topo topos[] = {{1, 1, 1}, {2, 1, 1}, {3, 1, 1},  {8, 1, 1}, {4, 2, 1},
                        {8, 1, 2}, {8, 1, 4}, {16, 2, 2}, {6, 1, 2}, {12, 3, 1}};
  for (const Topo& t : topos) {
    if (experts == 0 && t.ep > 1) continue;
    for (int buffer_mb : {1, 256}) {
      for (bool per_dtype : {false, true}) {
        v1::PlanRequest request = testing::MakeRequest(m, t.world, t.pp, t.ep, policy, buffer_mb);
        request.mutable_policy()->set_per_dtype(per_dtype);
        SCOPED_TRACE(::testing::Message() << "seed " << seed << " world " << t.world << " pp " << t.pp << " ep " << t.ep
                                          << " buffer " << buffer_mb << " per_dtype " << per_dtype);
        MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(request));
        MUONSHARD_ASSERT_OK(ValidatePlan(plan));
        if (policy != v1::BALANCED) ExpectSeedShardsEqual(plan);
        ExpectOwnersInTheirGroup(plan);
        MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan again, ComputePlan(request));
        ASSERT_EQ(plan.SerializeAsString(), again.SerializeAsString());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, InvariantsTest,
                         ::testing::Combine(::testing::Range(1, 31),
                                            ::testing::Values(v1::SEED, v1::SEED_ALL, v1::BALANCED)));

TEST(ValidatorTest, CatchesDoubleOwnershipAndGaps) {
  v1::ModelManifest m = testing::DenseManifest(2, 64, 128, 100);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(testing::MakeRequest(m, 4, 1, 1, v1::SEED_ALL)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));

  v1::Plan twice = plan;
  *twice.mutable_muon_buckets(0)->add_entries() = twice.muon_buckets(1).entries(0);
  EXPECT_THAT(ValidatePlan(twice), testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));

  v1::Plan gap = plan;
  gap.mutable_ranks(0)->mutable_slices()->RemoveLast();
  EXPECT_THAT(ValidatePlan(gap), testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));

  // An owned tensor outside plan.tensors (fuzz finding 1): views would read
  // out of bounds.
  v1::Plan foreign = plan;
  int owner = 0;
  while (owner < plan.ranks_size() && plan.ranks(owner).owned_size() == 0) ++owner;
  ASSERT_LT(owner, plan.ranks_size());
  foreign.mutable_ranks(owner)->mutable_owned(0)->set_tensor(plan.tensors_size() + 7);
  EXPECT_THAT(ValidatePlan(foreign),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("does not hold")));

  v1::Plan skewed = plan;
  skewed.mutable_adamw_buckets(0)->set_shard_offsets(1, 1);
  EXPECT_THAT(ValidatePlan(skewed),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("aligned")));
}

}  // namespace
}  // namespace muonshard::planner
