#include "plan/plan_stats.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "plan/model.h"
#include "plan/muon_rounds.h"
#include "plan/ns_blocks.h"

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
  for (const v1::RankPlan& r : plan.ranks()) {
    RankTotals& t = totals[r.rank()];
    for (const v1::OwnedTensor& o : r.owned()) {
      t.muon_numel += o.numel();
      t.muon_state_bytes += o.numel() * MuonStateBytesPerElem(plan.tensors(o.tensor()).dtype());
      t.ns_flops += o.ns_flops();
    }
    for (const v1::TensorSlice& s : r.slices()) t.adamw_numel += s.end() - s.begin();
  }
  AddBucketTotals(plan, totals);
  return totals;
}

void AddBucketTotals(const v1::Plan& plan, std::vector<RankTotals>& totals) {
  const int grad_esize = DTypeSize(plan.policy().grad_dtype());
  // Every rank of a group moves every Muon bucket of the group: sum per
  // group first (thousands of buckets x up to 1,024 ranks otherwise).
  std::vector<int64_t> group_reduce(plan.groups_size(), 0), group_broadcast(plan.groups_size(), 0);
  std::vector<int64_t> group_scatter(plan.groups_size(), 0), group_gather(plan.groups_size(), 0);
  // NOTE [Muon scatter rounds]: a round's buckets are handed to one
  // reduce-scatter and one all-gather, every segment as large as its largest.
  std::vector<bool> in_round;
  for (const ScatterRoundSize& r : ScatterRoundSizes(plan, &in_round)) {
    const int64_t padded = r.segment * plan.groups(r.group).ranks_size();
    group_scatter[r.group] += padded * grad_esize;
    group_gather[r.group] += padded * DTypeSize(r.dtype);
  }
  for (int i = 0; i < plan.muon_buckets_size(); ++i) {
    const v1::MuonBucket& b = plan.muon_buckets(i);
    if (in_round[i]) continue;
    group_reduce[b.group()] += b.numel() * grad_esize;
    group_broadcast[b.group()] += b.numel() * DTypeSize(b.dtype());
  }
  for (int gi = 0; gi < plan.groups_size(); ++gi) {
    const v1::CommGroup& g = plan.groups(gi);
    if (g.ranks_size() < 2) continue;
    for (int rank : g.ranks()) {
      totals[rank].grad_reduce_bytes += group_reduce[gi];
      totals[rank].param_broadcast_bytes += group_broadcast[gi];
      totals[rank].grad_reduce_scatter_bytes += group_scatter[gi];
      totals[rank].param_all_gather_bytes += group_gather[gi];
    }
  }
  std::vector<int64_t> adamw_state_bytes(totals.size(), 0);
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    const v1::CommGroup& g = plan.groups(b.group());
    for (int i = 0; i < g.ranks_size(); ++i) {
      RankTotals& t = totals[g.ranks(i)];
      const int64_t shard = b.shard_offsets(i + 1) - b.shard_offsets(i);
      t.adamw_shard_numel += shard;
      adamw_state_bytes[g.ranks(i)] += shard * AdamwStateBytesPerElem(b.dtype());
      if (g.ranks_size() < 2) continue;
      t.grad_reduce_scatter_bytes += b.numel() * grad_esize;
      t.param_all_gather_bytes += b.numel() * DTypeSize(b.dtype());
    }
  }
  for (size_t r = 0; r < totals.size(); ++r) {
    totals[r].optimizer_state_bytes = totals[r].muon_state_bytes + adamw_state_bytes[r];
  }
}

int64_t MatrixStateBytes(const v1::PlannedTensor& t) {
  const auto& held = HeldShape(t);
  const int n = held.size();
  const int64_t matrix = n >= 2 ? held[n - 2] * held[n - 1] : (n == 1 ? held[0] : 0);
  return matrix * MuonStateBytesPerElem(t.dtype());
}

v1::PlanStats ComputePlanStats(v1::Plan& plan, int64_t max_matrix_state_bytes, double max_matrix_flops) {
  ParamCounts counts;
  for (const v1::PlannedTensor& t : plan.tensors()) counts.Add(t.numel(), t.optimizer() == v1::MUON);
  return ComputePlanStats(plan, ComputeRankTotals(plan), counts, max_matrix_state_bytes, max_matrix_flops);
}

v1::PlanStats ComputePlanStats(v1::Plan& plan, const std::vector<RankTotals>& totals, const ParamCounts& counts,
                               int64_t max_matrix_state_bytes, double max_matrix_flops) {
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
  s.set_total_params(counts.total_params);
  s.set_muon_params(counts.muon_params);
  s.set_adamw_params(counts.adamw_params);
  s.set_muon_tensors(counts.muon_tensors);
  s.set_adamw_tensors(counts.adamw_tensors);
  Spread b = SpreadOf(bytes);
  s.set_max_state_bytes(static_cast<int64_t>(b.max));
  s.set_min_state_bytes(static_cast<int64_t>(b.min));
  s.set_mean_state_bytes(b.mean);
  s.set_lower_bound_state_bytes(std::max(b.mean, static_cast<double>(max_matrix_state_bytes)));
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

namespace {

// Martello-Toth L2: a lower bound on the bins of capacity `cap` the items
// (sorted descending) need. For each alpha in [0, cap/2]: items > cap - alpha
// and items in (cap/2, cap - alpha] each need their own bin; items in
// [alpha, cap/2] fill the second kind's spare room, then new bins.
int64_t BinsNeeded(const std::vector<double>& desc, const std::vector<double>& prefix, double cap) {
  const size_t count = desc.size();
  // Number of items strictly greater than x / at least x.
  // On a descending range, lower_bound(x, >) stops at the first item <= x and
  // upper_bound(x, >) at the first item < x.
  auto greater = [&](double x) {
    return static_cast<size_t>(std::lower_bound(desc.begin(), desc.end(), x, std::greater<double>()) - desc.begin());
  };
  auto at_least = [&](double x) {
    return static_cast<size_t>(std::upper_bound(desc.begin(), desc.end(), x, std::greater<double>()) - desc.begin());
  };
  int64_t best = 0;
  std::vector<double> alphas = {0};
  for (double x : desc) {
    if (x <= cap / 2 && x != alphas.back()) alphas.push_back(x);
  }
  for (double alpha : alphas) {
    const size_t j1 = greater(cap - alpha);
    const size_t j12 = greater(cap / 2);
    const size_t j123 = at_least(alpha);
    if (j1 > j12 || j12 > j123 || j123 > count) continue;
    const double sum2 = prefix[j12] - prefix[j1];
    const double sum3 = prefix[j123] - prefix[j12];
    const double spare = static_cast<double>(j12 - j1) * cap - sum2;
    const double extra = std::max(0.0, std::ceil((sum3 - spare) / cap - 1e-9));
    best = std::max<int64_t>(best, static_cast<int64_t>(j12 + extra));
  }
  return best;
}

// The smallest capacity (within 0.1%) at which L2 does not rule out packing
// the items into n bins, at least `floor`.
double BinPackingBound(std::vector<double> items, int n, double floor) {
  std::sort(items.begin(), items.end(), std::greater<double>());
  std::vector<double> prefix(items.size() + 1, 0);
  for (size_t i = 0; i < items.size(); ++i) prefix[i + 1] = prefix[i] + items[i];
  double lo = std::max(floor, items.empty() ? 0 : items[0]);
  if (items.empty() || BinsNeeded(items, prefix, lo) <= n) return lo;
  double hi = lo * 2;
  while (BinsNeeded(items, prefix, hi) > n) hi *= 2;
  while (hi - lo > lo * 1e-3) {
    const double mid = (lo + hi) / 2;
    (BinsNeeded(items, prefix, mid) > n ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

TightBounds ComputeTightBounds(const v1::Plan& plan) {
  TightBounds out;
  const int pp = plan.topology().pp();
  // Per group: the Muon matrices of its parts, and its AdamW state.
  // With tp > 1 a split matrix's state is its shards' (one per tp rank's
  // group) and its NS one task on the whole matrix (distributed: counted
  // with tp rank 0's group; duplicated: run by every tp rank; blocks aligned
  // with the split, ns_local: each tp rank's own blocks, in its group).
  // Sharded: every tp rank runs its own shard's part.
  const bool every_tp_rank_runs_ns = plan.policy().tp_muon() == v1::TP_MUON_DUPLICATED;
  const bool sharded_mode = plan.policy().tp_muon() == v1::TP_MUON_SHARDED;
  const int tp = std::max(1, plan.topology().tp());
  const int steps = plan.policy().ns_steps();
  std::vector<std::vector<double>> bytes(plan.groups_size()), flops(plan.groups_size());
  std::vector<double> adamw(plan.groups_size(), 0);
  for (const v1::PlannedTensor& t : plan.tensors()) {
    const bool split = IsTpSplit(t);
    const double matrix_bytes = static_cast<double>(MatrixStateBytes(t));
    for (const v1::TensorPart& part : t.parts()) {
      if (t.optimizer() != v1::MUON) {
        adamw[part.group()] += (part.element_end() - part.element_begin()) * AdamwStateBytesPerElem(t.dtype());
        continue;
      }
      const int tp_rank = plan.groups(part.group()).tp_rank();
      const bool local = split && t.ns_local();
      const std::optional<ShardedNs> sharded = split && sharded_mode ? ShardedNsOf(t) : std::nullopt;
      const bool runs_ns = !split || local || every_tp_rank_runs_ns || sharded.has_value() || tp_rank <= 0;
      const double matrix_flops = sharded.has_value()
                                      ? sharded->Flops(steps)
                                      : PlannedMatrixNsFlops(t, steps, tp, local ? std::max(tp_rank, 0) : 0);
      for (int m = part.matrix_begin(); m < part.matrix_end(); ++m) {
        bytes[part.group()].push_back(matrix_bytes);
        if (runs_ns) flops[part.group()].push_back(matrix_flops);
      }
    }
  }
  auto sum = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s;
  };
  for (int stage = 0; stage < pp; ++stage) {
    std::vector<double> stage_bytes, stage_flops;
    double stage_adamw = 0;
    for (const v1::CommGroup& g : plan.groups()) {
      if (g.stage() != stage) continue;
      stage_bytes.insert(stage_bytes.end(), bytes[g.id()].begin(), bytes[g.id()].end());
      stage_flops.insert(stage_flops.end(), flops[g.id()].begin(), flops[g.id()].end());
      stage_adamw += adamw[g.id()];
      if (g.colour() == v1::MOE_EXPERT) {
        const int n = g.ranks_size();
        out.state_bytes = std::max(out.state_bytes, BinPackingBound(bytes[g.id()], n, sum(bytes[g.id()]) / n));
        out.ns_flops = std::max(out.ns_flops, BinPackingBound(flops[g.id()], n, sum(flops[g.id()]) / n));
      }
    }
    // The stage's ranks: its DEFAULT groups' (one per tp rank).
    int n = 0;
    for (const v1::CommGroup& g : plan.groups()) {
      if (g.stage() == stage && g.colour() == v1::DEFAULT) n += g.ranks_size();
    }
    out.state_bytes = std::max(out.state_bytes, BinPackingBound(stage_bytes, n, (sum(stage_bytes) + stage_adamw) / n));
    out.ns_flops = std::max(out.ns_flops, BinPackingBound(stage_flops, n, sum(stage_flops) / n));
  }
  return out;
}

}  // namespace muonshard::planner
