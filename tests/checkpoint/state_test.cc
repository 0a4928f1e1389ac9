// The state seam: what a rank of a plan owns, and where its AdamW slices sit
// in its bucket shards.
#include "checkpoint/state.h"

#include <map>
#include <ostream>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan_view.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::checkpoint {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::HasSubstr;

struct PlanCase {
  bool moe;
  int world, pp, ep;
  v1::Policy policy;
};

void PrintTo(const PlanCase& c, std::ostream* os) {
  *os << (c.moe ? "moe" : "dense") << " w" << c.world << " pp" << c.pp << " ep" << c.ep << " "
      << v1::Policy_Name(c.policy);
}

class StateSeamTest : public ::testing::TestWithParam<PlanCase> {
 protected:
  void SetUp() override {
    const PlanCase& c = GetParam();
    MUONSHARD_ASSERT_OK_AND_ASSIGN(
        p_, testing::MakePlan(c.moe ? testing::SmallMoeManifest() : testing::SmallDenseManifest(), c.world, c.pp, c.ep,
                              c.policy));
  }
  testing::PlanAndRequest p_;
};

TEST_P(StateSeamTest, ExpectedShards_CoverEveryTensorStateOnceAcrossRanks) {
  // (tensor, kind) -> covered element count, and the rank-view overload
  // agreeing with the whole-plan one.
  std::map<std::pair<int, StateKind>, int64_t> covered;
  for (int r = 0; r < p_.plan.ranks_size(); ++r) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<ShardSpec> specs, ExpectedShards(p_.plan, r));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, planner::ExtractRankView(p_.plan, r));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<ShardSpec> from_view, ExpectedShards(view));
    ASSERT_EQ(specs.size(), from_view.size());
    int64_t muon = 0, adamw = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const ShardSpec& s = specs[i];
      EXPECT_EQ(std::tie(s.tensor, s.name, s.dtype, s.kind, s.begin, s.end, s.tensor_numel),
                std::tie(from_view[i].tensor, from_view[i].name, from_view[i].dtype, from_view[i].kind,
                         from_view[i].begin, from_view[i].end, from_view[i].tensor_numel));
      covered[{s.tensor, s.kind}] += s.numel();
      if (s.kind == StateKind::kMaster) (p_.plan.tensors(s.tensor).optimizer() == v1::MUON ? muon : adamw) += s.numel();
    }
    EXPECT_EQ(muon, p_.plan.ranks(r).muon_numel()) << "rank " << r;
    EXPECT_EQ(adamw, p_.plan.ranks(r).adamw_numel()) << "rank " << r;
  }
  for (int t = 0; t < p_.plan.tensors_size(); ++t) {
    for (StateKind kind : KindsOf(p_.plan.tensors(t).optimizer())) {
      EXPECT_EQ((covered[{t, kind}]), p_.plan.tensors(t).numel()) << p_.plan.tensors(t).name();
    }
  }
}

// Derived from the other side: walk this rank's shard of every bucket entry
// by entry; each real-element overlap must be a slice located at that offset.
TEST_P(StateSeamTest, LocateSlices_AgreeWithTheBucketLayout) {
  for (int r = 0; r < p_.plan.ranks_size(); ++r) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, planner::ExtractRankView(p_.plan, r));
    MUONSHARD_ASSERT_OK_AND_ASSIGN(std::vector<SliceLocation> located, LocateSlices(view));
    ASSERT_EQ(static_cast<int>(located.size()), view.rank().slices_size());
    std::map<std::tuple<int, int64_t>, std::tuple<int, int64_t, int64_t>> found;  // (bucket, offset) -> slice
    for (int i = 0; i < view.rank().slices_size(); ++i) {
      const v1::TensorSlice& s = view.rank().slices(i);
      found[{located[i].bucket, located[i].shard_offset}] = {s.tensor(), s.begin(), s.end()};
    }
    int expected = 0;
    for (const v1::AdamwBucket& b : view.adamw_buckets()) {
      int group_rank = -1;
      for (const v1::CommGroup& g : view.groups()) {
        for (int i = 0; i < g.ranks_size(); ++i) {
          if (g.id() == b.group() && g.ranks(i) == r) group_rank = i;
        }
      }
      ASSERT_GE(group_rank, 0);
      const int64_t lo = b.shard_offsets(group_rank), hi = b.shard_offsets(group_rank + 1);
      for (const v1::BucketEntry& e : b.entries()) {
        const int64_t begin = std::max(lo, e.offset()), end = std::min(hi, e.offset() + e.numel());
        if (begin >= end) continue;
        ++expected;
        auto it = found.find({b.id(), begin - lo});
        ASSERT_NE(it, found.end()) << "bucket " << b.id() << " offset " << begin - lo;
        EXPECT_EQ(it->second, std::make_tuple(e.tensor(), e.element_begin() + (begin - e.offset()),
                                              e.element_begin() + (end - e.offset())));
      }
    }
    EXPECT_EQ(expected, view.rank().slices_size());
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, StateSeamTest,
                         ::testing::Values(PlanCase{false, 4, 1, 1, v1::SEED}, PlanCase{false, 3, 1, 1, v1::BALANCED},
                                           PlanCase{false, 4, 2, 1, v1::SEED}, PlanCase{true, 4, 1, 2, v1::SEED},
                                           PlanCase{true, 8, 2, 2, v1::BALANCED}, PlanCase{true, 1, 1, 1, v1::SEED}));

TEST(StateSeamErrorsTest, RankOutsideThePlan_IsInvalidArgument) {
  MUONSHARD_ASSERT_OK_AND_ASSIGN(testing::PlanAndRequest p, testing::MakePlan(testing::SmallDenseManifest(), 2));
  EXPECT_THAT(ExpectedShards(p.plan, 2), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2")));
  MUONSHARD_ASSERT_OK_AND_ASSIGN(v1::RankView view, planner::ExtractRankView(p.plan, 0));
  view.mutable_adamw_buckets()->Clear();
  EXPECT_THAT(LocateSlices(view), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not in the view")));
}

TEST(StateKindTest, ProtoRoundTripAndKinds) {
  for (StateKind k : {StateKind::kMaster, StateKind::kMomentum, StateKind::kMoment1, StateKind::kMoment2}) {
    MUONSHARD_ASSERT_OK_AND_ASSIGN(StateKind back, FromProto(ToProto(k)));
    EXPECT_EQ(back, k);
  }
  EXPECT_THAT(FromProto(v1::STATE_KIND_UNSPECIFIED), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kind")));
  EXPECT_THAT(KindsOf(v1::MUON), ::testing::ElementsAre(StateKind::kMaster, StateKind::kMomentum));
  EXPECT_THAT(KindsOf(v1::ADAMW), ::testing::ElementsAre(StateKind::kMaster, StateKind::kMoment1, StateKind::kMoment2));
}

}  // namespace
}  // namespace muonshard::checkpoint
