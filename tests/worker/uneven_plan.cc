#include "tests/worker/uneven_plan.h"

#include <algorithm>
#include <vector>

#include "common/status_macros.h"
#include "plan/bucketing.h"
#include "plan/memory.h"
#include "plan/model.h"
#include "plan/plan_stats.h"
#include "plan/plan_validator.h"

namespace muonshard::worker::testing {
namespace {

using planner::DTypeSize;

int64_t MatrixNumel(const v1::PlannedTensor& t) {
  const int n = t.shape_size();
  return t.shape(n - 2) * t.shape(n - 1);
}

int GroupRankOf(const v1::CommGroup& g, int rank) {
  return static_cast<int>(std::find(g.ranks().begin(), g.ranks().end(), rank) - g.ranks().begin());
}

// Lays the entries out back to back with Paddle's reduce padding.
void Relayout(v1::MuonBucket& b, const v1::Plan& plan) {
  int64_t offset = 0;
  for (v1::BucketEntry& e : *b.mutable_entries()) {
    e.set_offset(offset);
    e.set_padded_numel(planner::ReducePaddedNumel(e.numel(), DTypeSize(plan.tensors(e.tensor()).dtype())));
    offset += e.padded_numel();
  }
  b.set_numel(offset);
}

void SplitMuonStacks(v1::Plan& plan) {
  const int original = plan.muon_buckets_size();
  for (int i = 0; i < original; ++i) {
    const v1::CommGroup& g = plan.groups(plan.muon_buckets(i).group());
    if (g.ranks_size() < 2) continue;
    const int next_owner = g.ranks((GroupRankOf(g, plan.muon_buckets(i).owner()) + 1) % g.ranks_size());
    for (int k = 0; k < plan.muon_buckets(i).entries_size(); ++k) {
      v1::BucketEntry& e = *plan.mutable_muon_buckets(i)->mutable_entries(k);
      const v1::PlannedTensor& t = plan.tensors(e.tensor());
      const int64_t matrix = MatrixNumel(t);
      const int64_t matrices = e.numel() / matrix;
      if (t.shape_size() != 3 || matrices < 2) continue;
      const int64_t kept = matrices / 2;
      v1::MuonBucket* split = plan.add_muon_buckets();
      split->set_id(plan.muon_buckets_size() - 1);
      split->set_group(plan.muon_buckets(i).group());
      split->set_owner(next_owner);
      split->set_dtype(plan.muon_buckets(i).dtype());
      v1::BucketEntry* moved = split->add_entries();
      moved->set_tensor(e.tensor());
      moved->set_element_begin(e.element_begin() + kept * matrix);
      moved->set_numel((matrices - kept) * matrix);
      // `e` may have moved when the bucket list grew.
      plan.mutable_muon_buckets(i)->mutable_entries(k)->set_numel(kept * matrix);
      Relayout(*split, plan);
    }
    Relayout(*plan.mutable_muon_buckets(i), plan);
  }
}

void RebuildOwned(v1::Plan& plan) {
  for (v1::RankPlan& r : *plan.mutable_ranks()) r.clear_owned();
  for (const v1::MuonBucket& b : plan.muon_buckets()) {
    for (const v1::BucketEntry& e : b.entries()) {
      const v1::PlannedTensor& t = plan.tensors(e.tensor());
      const int64_t matrix = MatrixNumel(t);
      v1::OwnedTensor* o = plan.mutable_ranks(b.owner())->add_owned();
      o->set_tensor(e.tensor());
      o->set_matrix_begin(static_cast<int>(e.element_begin() / matrix));
      o->set_matrix_end(static_cast<int>((e.element_begin() + e.numel()) / matrix));
      o->set_numel(e.numel());
      o->set_ns_flops((o->matrix_end() - o->matrix_begin()) * planner::NsFlops(t.shape(t.shape_size() - 2),
                                                                               t.shape(t.shape_size() - 1),
                                                                               plan.policy().ns_steps()));
      o->set_bucket(b.id());
    }
  }
}

void UnevenShards(v1::AdamwBucket& b, int n) {
  if (n < 2) return;
  constexpr int kWeights[] = {1, 3, 0, 2};
  const int64_t align = planner::kAlignBytes / DTypeSize(b.dtype());
  const int64_t units = b.numel() / align;
  int64_t total_weight = 0;
  for (int i = 0; i < n; ++i) total_weight += kWeights[i % 4];
  int64_t prefix = 0;
  for (int i = 0; i < n; ++i) {
    b.set_shard_offsets(i, align * (units * prefix / total_weight));
    prefix += kWeights[i % 4];
  }
  b.set_shard_offsets(n, b.numel());
}

// The planner's slices (EmitSlices): each group rank's piece of every entry
// overlapping its shard, clipped to the entry's real elements.
void AddSlices(v1::Plan& plan, const v1::AdamwBucket& b) {
  const v1::CommGroup& g = plan.groups(b.group());
  for (int i = 0; i < g.ranks_size(); ++i) {
    const int64_t rb = b.shard_offsets(i);
    const int64_t re = b.shard_offsets(i + 1);
    for (const v1::BucketEntry& e : b.entries()) {
      const int64_t begin = std::max(e.offset(), rb) - e.offset();
      const int64_t end = std::min(e.offset() + e.padded_numel(), re) - e.offset();
      if (begin >= end || begin >= e.numel()) continue;
      v1::TensorSlice* s = plan.mutable_ranks(g.ranks(i))->add_slices();
      s->set_tensor(e.tensor());
      s->set_begin(e.element_begin() + begin);
      s->set_end(e.element_begin() + std::min(end, e.numel()));
      s->set_padding(std::max<int64_t>(0, end - std::max(begin, e.numel())));
      s->set_bucket(b.id());
    }
  }
}

void MaxMatrix(const v1::Plan& plan, int64_t* state_bytes, double* flops) {
  *state_bytes = 0;
  *flops = 0;
  for (const v1::PlannedTensor& t : plan.tensors()) {
    if (t.optimizer() != v1::MUON) continue;
    const int64_t rows = t.shape(t.shape_size() - 2);
    const int64_t cols = t.shape(t.shape_size() - 1);
    *state_bytes = std::max(*state_bytes, planner::MatrixStateBytes(t));
    *flops = std::max(*flops, planner::NsFlops(rows, cols, plan.policy().ns_steps()));
  }
}

}  // namespace

absl::StatusOr<v1::Plan> MakeUnevenPlan(const v1::Plan& input) {
  v1::Plan plan = input;
  SplitMuonStacks(plan);
  RebuildOwned(plan);
  for (v1::RankPlan& r : *plan.mutable_ranks()) r.clear_slices();
  for (v1::AdamwBucket& b : *plan.mutable_adamw_buckets()) {
    UnevenShards(b, plan.groups(b.group()).ranks_size());
    AddSlices(plan, b);
  }
  int64_t max_state_bytes = 0;
  double max_flops = 0;
  MaxMatrix(plan, &max_state_bytes, &max_flops);
  *plan.mutable_stats() = planner::ComputePlanStats(plan, max_state_bytes, max_flops);
  planner::AddMemory(plan);  // the shards moved: so did the memory
  MUONSHARD_RETURN_IF_ERROR(planner::ValidatePlan(plan));
  return plan;
}

}  // namespace muonshard::worker::testing
