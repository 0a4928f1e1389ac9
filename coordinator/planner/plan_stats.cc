#include "coordinator/planner/plan_stats.h"

#include <algorithm>

#include "coordinator/planner/model.h"

namespace muonshard::planner {
namespace {

// Imbalance figures of one per-rank quantity.
struct Spread {
  double max = 0;
  double min = 0;
  double mean = 0;
};

template <typename T>
Spread SpreadOf(const std::vector<T>& v) {
  Spread s;
  if (v.empty()) return s;
  s.max = static_cast<double>(*std::max_element(v.begin(), v.end()));
  s.min = static_cast<double>(*std::min_element(v.begin(), v.end()));
  double sum = 0;
  for (T x : v) sum += static_cast<double>(x);
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

double Ratio(double a, double b) { return b > 0 ? a / b : (a > 0 ? 0 : 1); }

}  // namespace

std::vector<RankTotals> ComputeRankTotals(const v1::Plan& plan) {
  std::vector<RankTotals> totals(plan.ranks_size());
  const int grad_esize = DTypeSize(plan.policy().grad_dtype());
  for (const v1::RankPlan& r : plan.ranks()) {
    RankTotals& t = totals[r.rank()];
    for (const v1::OwnedTensor& o : r.owned()) {
      t.muon_numel += o.numel();
      t.ns_flops += o.ns_flops();
    }
    for (const v1::TensorSlice& s : r.slices()) t.adamw_numel += s.end() - s.begin();
  }
  for (const v1::MuonBucket& b : plan.muon_buckets()) {
    const v1::CommGroup& g = plan.groups(b.group());
    if (g.ranks_size() < 2) continue;
    for (int rank : g.ranks()) {
      totals[rank].grad_reduce_bytes += b.numel() * grad_esize;
      totals[rank].param_broadcast_bytes += b.numel() * DTypeSize(b.dtype());
    }
  }
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    const v1::CommGroup& g = plan.groups(b.group());
    for (int i = 0; i < g.ranks_size(); ++i) {
      RankTotals& t = totals[g.ranks(i)];
      t.adamw_shard_numel += b.shard_offsets(i + 1) - b.shard_offsets(i);
      if (g.ranks_size() < 2) continue;
      t.grad_reduce_scatter_bytes += b.numel() * grad_esize;
      t.param_all_gather_bytes += b.numel() * DTypeSize(b.dtype());
    }
  }
  for (RankTotals& t : totals) {
    t.optimizer_state_bytes =
        t.muon_numel * kMuonStateBytesPerElem + t.adamw_shard_numel * kAdamwStateBytesPerElem;
  }
  return totals;
}

v1::PlanStats ComputePlanStats(v1::Plan& plan, int64_t max_matrix_numel, double max_matrix_flops) {
  std::vector<RankTotals> totals = ComputeRankTotals(plan);
  std::vector<int64_t> bytes;
  std::vector<double> flops;
  for (v1::RankPlan& r : *plan.mutable_ranks()) {
    const RankTotals& t = totals[r.rank()];
    r.set_muon_numel(t.muon_numel);
    r.set_adamw_numel(t.adamw_numel);
    r.set_adamw_shard_numel(t.adamw_shard_numel);
    r.set_optimizer_state_bytes(t.optimizer_state_bytes);
    r.set_ns_flops(t.ns_flops);
    r.set_grad_reduce_bytes(t.grad_reduce_bytes);
    r.set_grad_reduce_scatter_bytes(t.grad_reduce_scatter_bytes);
    r.set_param_broadcast_bytes(t.param_broadcast_bytes);
    r.set_param_all_gather_bytes(t.param_all_gather_bytes);
    bytes.push_back(t.optimizer_state_bytes);
    flops.push_back(t.ns_flops);
  }

  v1::PlanStats s;
  for (const v1::PlannedTensor& t : plan.tensors()) {
    s.set_total_params(s.total_params() + t.numel());
    if (t.optimizer() == v1::MUON) {
      s.set_muon_params(s.muon_params() + t.numel());
      s.set_muon_tensors(s.muon_tensors() + 1);
    } else {
      s.set_adamw_params(s.adamw_params() + t.numel());
      s.set_adamw_tensors(s.adamw_tensors() + 1);
    }
  }
  Spread b = SpreadOf(bytes);
  s.set_max_state_bytes(static_cast<int64_t>(b.max));
  s.set_min_state_bytes(static_cast<int64_t>(b.min));
  s.set_mean_state_bytes(b.mean);
  s.set_lower_bound_state_bytes(
      std::max(b.mean, static_cast<double>(max_matrix_numel * kMuonStateBytesPerElem)));
  s.set_memory_imbalance(b.max > 0 ? (b.max - b.min) / b.max : 0);
  s.set_max_over_mean_state_bytes(Ratio(b.max, b.mean));
  s.set_max_over_lb_state_bytes(Ratio(b.max, s.lower_bound_state_bytes()));

  Spread f = SpreadOf(flops);
  s.set_max_ns_flops(f.max);
  s.set_min_ns_flops(f.min);
  s.set_mean_ns_flops(f.mean);
  s.set_lower_bound_ns_flops(std::max(f.mean, max_matrix_flops));
  s.set_flops_imbalance(f.max > 0 ? (f.max - f.min) / f.max : 0);
  s.set_max_over_mean_ns_flops(Ratio(f.max, f.mean));
  s.set_max_over_lb_ns_flops(Ratio(f.max, s.lower_bound_ns_flops()));
  return s;
}

}  // namespace muonshard::planner
