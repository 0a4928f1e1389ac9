#include "cli/plan_table.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace muonshard::cli {

constexpr double kMiB = 1024.0 * 1024.0;

namespace {

// Tensor parallelism: the mode and the bytes the TP ops move per step.
void PrintTpSummary(const v1::Plan& plan, std::ostream& out) {
  int64_t total = 0, busiest = 0;
  for (const v1::RankPlan& r : plan.ranks()) {
    total += r.tp_recv_bytes();
    busiest = std::max(busiest, r.tp_send_bytes() + r.tp_recv_bytes());
  }
  out << absl::StrFormat(
      "tensor parallel  tp %d  %s  TP bytes per step %.1f MiB (busiest rank sends+receives %.1f MiB)\n",
      plan.topology().tp(), v1::TpMuonMode_Name(plan.policy().tp_muon()), total / kMiB, busiest / kMiB);
}

}  // namespace

void PrintPlanSummary(const v1::Plan& plan, std::ostream& out) {
  const v1::PlanStats& s = plan.stats();
  out << absl::StrFormat("model %s  world %d  pp %d  ep %d%s  policy %s  buffer %d MiB\n",
                         plan.model(), plan.topology().world_size(), plan.topology().pp(),
                         plan.topology().ep(),
                         plan.topology().tp() > 1 ? absl::StrFormat("  tp %d", plan.topology().tp()) : "",
                         v1::Policy_Name(plan.policy().policy()), plan.policy().comm_buffer_mb());
  out << absl::StrFormat("hash %s\n", plan.content_hash());
  out << absl::StrFormat("params %d (muon %d in %d tensors, adamw %d in %d tensors)\n",
                         s.total_params(), s.muon_params(), s.muon_tensors(), s.adamw_params(),
                         s.adamw_tensors());
  out << absl::StrFormat(
      "optimizer state  max %.1f MiB  min %.1f MiB  mean %.1f MiB  (max-min)/max %.4f  "
      "max/mean %.3f  max/LB %.3f\n",
      s.max_state_bytes() / kMiB, s.min_state_bytes() / kMiB, s.mean_state_bytes() / kMiB,
      s.memory_imbalance(), s.max_over_mean_state_bytes(), s.max_over_lb_state_bytes());
  out << absl::StrFormat(
      "newton-schulz    max %.1f GFLOP  min %.1f GFLOP  mean %.1f GFLOP  (max-min)/max %.4f  "
      "max/mean %.3f  max/LB %.3f\n",
      s.max_ns_flops() / 1e9, s.min_ns_flops() / 1e9, s.mean_ns_flops() / 1e9,
      s.flops_imbalance(), s.max_over_mean_ns_flops(), s.max_over_lb_ns_flops());
  if (plan.topology().tp() > 1) PrintTpSummary(plan, out);
}

// buddy_MiB: the host memory a rank holds with muonshard-worker
// --buddy-every (NOTE [Buddy copies] in worker/buddy_copies.h): a snapshot
// of its own state and a copy of its left neighbour's.
void PrintPlanTable(const v1::Plan& plan, std::ostream& out) {
  out << absl::StrFormat("%6s %5s %4s %14s %14s %7s %16s %16s %10s\n", "rank", "stage", "ep",
                         "state_MiB", "ns_GFLOP", "owned", "muon_elems", "slice_elems", "buddy_MiB");
  const int world = plan.ranks_size();
  for (int i = 0; i < world; ++i) {
    const v1::RankPlan& r = plan.ranks(i);
    const int64_t buddy = r.optimizer_state_bytes() + plan.ranks((i + world - 1) % world).optimizer_state_bytes();
    out << absl::StrFormat("%6d %5d %4d %14.1f %14.1f %7d %16d %16d %10.1f\n", r.rank(), r.stage(),
                           r.ep_rank(), r.optimizer_state_bytes() / kMiB, r.ns_flops() / 1e9,
                           r.owned_size(), r.muon_numel(), r.adamw_numel(), world > 1 ? buddy / kMiB : 0.0);
  }
  PrintPlanSummary(plan, out);
}

}  // namespace muonshard::cli
