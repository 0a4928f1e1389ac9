// Per-block Newton-Schulz through the coordinator (TensorSpec.ns_blocks): a
// bad block spec is refused on submit with INVALID_ARGUMENT naming the
// tensor and the sizes, and nothing is stored; a good one is stored, and the
// plan and every rank's view carry the blocks.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/plan_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/ns_blocks.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/manifest_builder.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::coordinator {
namespace {

using ::muonshard::testing::FakeClock;
using ::muonshard::testing::IsOk;
using ::muonshard::testing::MakeRequest;
using ::muonshard::testing::ManifestBuilder;
using ::muonshard::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Counts the store's writes.
class CountingStore final : public ForwardingPlanStore {
 public:
  explicit CountingStore(PlanStore* inner) : ForwardingPlanStore(inner) {}
  absl::StatusOr<PutResult> Put(v1::PlanVersionInfo info, const v1::PlanRequest& canonical,
                                const v1::Plan& plan) override {
    ++puts;
    return ForwardingPlanStore::Put(std::move(info), canonical, plan);
  }
  int puts = 0;
};

// Two layers of a fused q | k | v [96, 64] and gate | up [128, 64], with
// the blocks `qkv` (text form) on the first layer's query_key_value.
v1::SubmitPlanRequest FusedSubmit(absl::string_view qkv) {
  ManifestBuilder b("fused");
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    b.Add(p + "attention.query_key_value.weight", {96, 64}).Add(p + "mlp.gate_up_proj.weight", {128, 64});
  }
  v1::ModelManifest m = b.Build();
  *m.mutable_tensors(0)->mutable_ns_blocks() = *planner::ParseNsBlocks(qkv);
  *m.mutable_tensors(1)->mutable_ns_blocks() = *planner::ParseNsBlocks("rows:64,64");
  v1::SubmitPlanRequest r;
  *r.mutable_request() = MakeRequest(m, 4);
  return r;
}

class NsBlocksSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = CoordinatorService::Create(&store_, &clock_, CoordinatorOptions(), &observer_);
    ASSERT_THAT(s.status(), IsOk());
    service_ = std::move(*s);
  }

  FakeClock clock_;
  CoordinatorObserver observer_;
  std::unique_ptr<PlanStore> memory_ = NewInMemoryPlanStore();
  CountingStore store_{memory_.get()};
  std::unique_ptr<CoordinatorService> service_;
};

TEST_F(NsBlocksSubmitTest, BadBlocksAreRefusedAndNothingIsStored) {
  for (const char* bad : {"rows:32,32,16", "rows:32,32,32x2", "cols:stride5"}) {
    EXPECT_THAT(service_->SubmitPlan(FusedSubmit(bad)).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("tensor \"model.layers.0.attention.query_key_value.weight\""),
                               HasSubstr(absl::StrCat("ns_blocks ", bad, ": ")))))
        << bad;
  }
  EXPECT_EQ(store_.puts, 0);
  MUONSHARD_ASSERT_OK_AND_ASSIGN(auto versions, memory_->ListVersions());
  EXPECT_THAT(versions, IsEmpty());
  EXPECT_THAT(service_->GetPlan(v1::GetPlanRequest()).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no plan")));
}

TEST_F(NsBlocksSubmitTest, GoodBlocksAreStoredAndReachEveryRankView) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::SubmitPlanResponse submitted,
                                 service_->SubmitPlan(FusedSubmit("rows:16,16,16x2")));
  EXPECT_EQ(store_.puts, 1);
  // Other blocks are another request: another version.
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::SubmitPlanResponse other, service_->SubmitPlan(FusedSubmit("rows:32,32,32")));
  EXPECT_NE(other.content_hash(), submitted.content_hash());
  EXPECT_NE(other.version(), submitted.version());

  v1::GetPlanRequest get;
  get.set_version(submitted.version());
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::GetPlanResponse whole, service_->GetPlan(get));
  EXPECT_EQ(planner::NsBlocksText(whole.plan().tensors(0).ns_blocks()), "rows:16,16,16x2");
  EXPECT_EQ(planner::NsBlocksText(whole.plan().tensors(1).ns_blocks()), "rows:64,64");
  int seen = 0;
  for (int rank = 0; rank < 4; ++rank) {
    get.set_rank(rank);
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::GetPlanResponse view, service_->GetPlan(get));
    for (const v1::IndexedTensor& t : view.rank_view().tensors()) {
      if (t.index() != 0) continue;
      EXPECT_EQ(planner::NsBlocksText(t.tensor().ns_blocks()), "rows:16,16,16x2");
      ++seen;
    }
  }
  EXPECT_EQ(seen, 4);  // pp 1: every rank's DEFAULT group holds it
}

}  // namespace
}  // namespace muonshard::coordinator
