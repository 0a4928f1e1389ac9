#include "plan/planner.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan_validator.h"
#include "plan/plan_view.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::planner {
namespace {

using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::ManifestBuilder;
using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

TEST(PlannerTest, HandComputedTwoRanks) {
  // Muon: a (64x64 = 4096), b (32x64 = 2048); AdamW: n (100 bf16), e (embed 10x8 fp32).
  v1::ModelManifest m = ManifestBuilder()
                            .Add("model.embed_tokens.weight", {10, 8}, v1::FP32)
                            .Add("model.layers.0.a.weight", {64, 64})
                            .Add("model.layers.0.n.weight", {100})
                            .Add("model.layers.0.b.weight", {32, 64})
                            .Build();
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(MakeRequest(m, 2, 1, 1, v1::SEED_ALL)));
  MUONSHARD_ASSERT_OK(ValidatePlan(plan));
  AddDisplayNames(&plan);
  // seed-all greedy: a -> rank 0, b -> rank 1.
  ASSERT_EQ(plan.ranks(0).owned_size(), 1);
  EXPECT_EQ(plan.ranks(0).owned(0).name(), "model.layers.0.a.weight");
  ASSERT_EQ(plan.ranks(1).owned_size(), 1);
  EXPECT_EQ(plan.ranks(1).owned(0).name(), "model.layers.0.b.weight");
  // AdamW: sorted by dtype name: n (bf16) then embed (fp32) -> two buckets.
  ASSERT_EQ(plan.adamw_buckets_size(), 2);
  const v1::AdamwBucket& bf16 = plan.adamw_buckets(0);
  EXPECT_EQ(bf16.dtype(), v1::BF16);
  // 100 bf16 elems padded to 128 * 2 = 256; each rank owns 128.
  EXPECT_EQ(bf16.numel(), 256);
  EXPECT_THAT(bf16.shard_offsets(), ::testing::ElementsAre(0, 128, 256));
  const v1::AdamwBucket& fp32 = plan.adamw_buckets(1);
  EXPECT_EQ(fp32.numel(), 128);  // 80 fp32 padded to 64 * 2
  // Rank 0: n [0, 100) with 28 padding, embed [0, 64). Rank 1: embed [64, 80).
  ASSERT_EQ(plan.ranks(0).slices_size(), 2);
  EXPECT_EQ(plan.ranks(0).slices(0).name(), "model.layers.0.n.weight");
  EXPECT_EQ(plan.ranks(0).slices(0).end(), 100);
  EXPECT_EQ(plan.ranks(0).slices(0).padding(), 28);
  EXPECT_EQ(plan.ranks(0).slices(1).end(), 64);
  ASSERT_EQ(plan.ranks(1).slices_size(), 1);
  EXPECT_EQ(plan.ranks(1).slices(0).begin(), 64);
  EXPECT_EQ(plan.ranks(1).slices(0).end(), 80);
  EXPECT_EQ(plan.ranks(1).slices(0).padding(), 48);
  // State: bf16 Muon 8 B per element (master + momentum), bf16 AdamW 12 B
  // (master + two moments), fp32 AdamW 8 B (two moments: an fp32 parameter
  // is its own master). Rank 0 = 4096 * 8 + 128 * 12 + 64 * 8; rank 1 =
  // 2048 * 8 + 128 * 12 + 64 * 8.
  EXPECT_EQ(plan.ranks(0).optimizer_state_bytes(), 4096 * 8 + 128 * 12 + 64 * 8);
  EXPECT_EQ(plan.ranks(1).optimizer_state_bytes(), 2048 * 8 + 128 * 12 + 64 * 8);
  // NS FLOPs of a 32x64 matrix: 5 * (4 * 32^2 * 64 + 2 * 32^3).
  EXPECT_DOUBLE_EQ(plan.ranks(1).ns_flops(), 5.0 * (4.0 * 32 * 32 * 64 + 2.0 * 32 * 32 * 32));
}

TEST(PlannerTest, DeterministicBytesAndHash) {
  v1::ModelManifest m = testing::DenseManifest(4, 256, 512, 1000);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan a, ComputePlan(MakeRequest(m, 8)));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan b, ComputePlan(MakeRequest(m, 8)));
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
  EXPECT_THAT(a.content_hash(), HasSubstr("sha256:"));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan c, ComputePlan(MakeRequest(m, 4)));
  EXPECT_NE(a.content_hash(), c.content_hash());
}

// The hash is the pipeline's last stage, stamped on whichever plan the fit
// stage keeps: the canonical request's ContentHash on every path (tp 1, the
// balanced policy's memory-only retry, tp > 1 with and without experts).
TEST(PlannerTest, EveryPathStampsTheCanonicalRequestsHashAndFormat) {
  std::vector<v1::PlanRequest> requests;
  requests.push_back(MakeRequest(testing::DenseManifest(2, 64, 128, 100), 4));
  v1::ModelManifest retry = ManifestBuilder()
                                .Add("model.layers.0.x.weight", {16, 8192})
                                .Add("model.layers.0.y1.weight", {256, 256})
                                .Add("model.layers.0.y2.weight", {256, 256})
                                .Build();
  requests.push_back(MakeRequest(retry, 2, 1, 1, v1::BALANCED));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan unfitted, ComputePlan(requests.back()));
  requests.back().mutable_topology()->add_device_memory_bytes(unfitted.stats().max_memory_bytes() - 1);
  v1::ModelManifest split = testing::DenseManifest(1, 64, 128, 128);
  for (v1::TensorSpec& t : *split.mutable_tensors()) {
    if (t.name().find("up_proj") != std::string::npos) t.set_tp_split(v1::TP_COLUMN);
    if (t.name().find("down_proj") != std::string::npos) t.set_tp_split(v1::TP_ROW);
  }
  requests.push_back(MakeRequest(split, 4, 1, 1, v1::BALANCED));
  requests.back().mutable_topology()->set_tp(2);
  requests.push_back(MakeRequest(testing::MoeManifest(1, 64, 32, 4, 128), 4, 1, 2, v1::BALANCED));
  requests.back().mutable_topology()->set_tp(2);
  for (const v1::PlanRequest& request : requests) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan plan, ComputePlan(request));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::PlanRequest canonical, CanonicalizeRequest(request));
    EXPECT_EQ(plan.content_hash(), ContentHash(canonical));
    EXPECT_EQ(plan.format_version(), kPlanFormatVersion);
  }
}

TEST(PlannerTest, SharedPlanOnItsArena_SameBytesAndOutlivesTheFirstPointer) {
  v1::PlanRequest request = MakeRequest(testing::MoeManifest(2, 64, 32, 8, 100), 8, 1, 2);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::Plan heap, ComputePlan(request));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(std::shared_ptr<const v1::Plan> shared, ComputeSharedPlan(request));
  EXPECT_NE(shared->GetArena(), nullptr);
  std::shared_ptr<const v1::Plan> kept = shared;
  shared.reset();
  EXPECT_EQ(kept->SerializeAsString(), heap.SerializeAsString());
  request.mutable_topology()->set_world_size(7);
  EXPECT_THAT(ComputeSharedPlan(request), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world_size")));
}

TEST(PlannerTest, RejectsBadManifests) {
  auto plan_of = [](const v1::ModelManifest& m) { return ComputePlan(MakeRequest(m, 2)); };
  EXPECT_THAT(plan_of(ManifestBuilder().Add("a", {2, 2}).Add("a", {3}).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor \"a\": duplicate name")));
  EXPECT_THAT(plan_of(ManifestBuilder().Add("model.layers.3.mlp.up_proj.weight", {4, 0}).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor \"model.layers.3.mlp.up_proj.weight\": shape has a 0 dimension")));
  EXPECT_THAT(plan_of(ManifestBuilder().Add("x", {-1}).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(plan_of(ManifestBuilder().Add("x", {}).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape is empty")));
  EXPECT_THAT(plan_of(ManifestBuilder().Add("x", {1 << 30, 1 << 30, 1 << 30}).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
  EXPECT_THAT(plan_of(ManifestBuilder().Add("x", {1, 1, 1, 1, 1, 1, 1, 1, 1}).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 8")));
  EXPECT_THAT(plan_of(ManifestBuilder().Add("x", {4}, v1::DTYPE_UNSPECIFIED).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor \"x\": dtype is missing")));
  EXPECT_THAT(plan_of(ManifestBuilder().Add("x", {4}, static_cast<v1::DType>(9)).Build()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown dtype")));
  EXPECT_THAT(plan_of(v1::ModelManifest()), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no tensors")));
}

TEST(PlannerTest, ExpertsMustDivideEp) {
  v1::ModelManifest m = testing::MoeManifest(1, 64, 32, 6, 100);
  EXPECT_THAT(ComputePlan(MakeRequest(m, 8, 1, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("6 experts are not divisible by ep 4")));
}

}  // namespace
}  // namespace muonshard::planner
