#include "cli/plan_table.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "plan/model.h"
#include "plan/muon_rounds.h"
#include "plan/ns_blocks.h"

namespace muonshard::cli {
namespace {

using RowValue = std::function<double(int row)>;

// An identifier column (rank, stage): the value as an integer, ascending.
Column IdColumn(const char* header, int width, const char* key, RowValue value) {
  return Column{header,
                width,
                [value](int row) { return absl::StrCat(static_cast<int64_t>(value(row))); },
                key,
                SortOrder::kAscending,
                value};
}

// A size column (bytes, FLOPs, counts): `format`ted, largest first.
Column SizeColumn(const char* header, int width, const char* key, RowValue value, std::string (*format)(double)) {
  return Column{header, width, [value, format](int row) { return format(value(row)); }, key, SortOrder::kLargestFirst,
                value};
}

std::string MibText(double bytes) { return Mib(bytes); }
std::string GflopText(double flops) { return Gflop(flops); }
std::string CountText(double n) { return WithThousands(static_cast<int64_t>(n)); }

// buddy_MiB: the host memory a rank holds with muonshard-worker
// --buddy-every (NOTE [Buddy copies] in worker/buddy_copies.h): a snapshot
// of its own state and a copy of its left neighbour's.
double BuddyBytes(const v1::Plan& plan, int i) {
  const int world = plan.ranks_size();
  if (world <= 1) return 0;
  return static_cast<double>(plan.ranks(i).optimizer_state_bytes() +
                             plan.ranks((i + world - 1) % world).optimizer_state_bytes());
}

std::string HeadroomText(const v1::RankMemory& m) {
  return m.capacity_bytes() > 0 ? Mib(static_cast<double>(m.headroom_bytes())) : "-";
}

// Whole training memory per rank (docs/planner.md, "Memory"): the largest
// and its terms, the mean, and with capacities the smallest headroom.
void PrintMemorySummary(const v1::Plan& plan, std::ostream& out) {
  const v1::PlanStats& s = plan.stats();
  const int worst = s.max_memory_rank();
  if (worst < 0 || worst >= plan.ranks_size()) return;
  out << absl::StrFormat("training memory  max %s MiB (rank %d)  mean %s MiB", Mib(s.max_memory_bytes()), worst,
                         Mib(s.mean_memory_bytes()));
  if (plan.ranks(worst).memory().capacity_bytes() > 0) {
    out << absl::StrFormat("  min headroom %s MiB", Mib(s.min_headroom_bytes()));
  }
  out << absl::StrFormat("\n  rank %d: %s\n", worst, MemoryTerms(plan.ranks(worst).memory()));
}

// Tensor parallelism: the mode and the bytes the TP ops move per step.
void PrintTpSummary(const v1::Plan& plan, std::ostream& out) {
  int64_t total = 0, busiest = 0;
  for (const v1::RankPlan& r : plan.ranks()) {
    total += r.tp_recv_bytes();
    busiest = std::max(busiest, r.tp_send_bytes() + r.tp_recv_bytes());
  }
  out << absl::StrFormat("tensor parallel  tp %d  %s  TP bytes per step %s MiB (busiest rank sends+receives %s MiB)\n",
                         plan.topology().tp(), v1::TpMuonMode_Name(plan.policy().tp_muon()), Mib(total), Mib(busiest));
}

// NOTE [Muon scatter rounds]: how many of the shared groups' Muon buckets
// go in rounds, and in how many.
void PrintMuonRounds(const v1::Plan& plan, std::ostream& out) {
  const absl::StatusOr<std::vector<std::vector<planner::MuonRound>>> rounds = planner::MuonScatterRoundsOf(plan);
  if (!rounds.ok()) {
    out << "muon reduce      scatter rounds: " << rounds.status().message() << "\n";
    return;
  }
  int scatter = 0, in_rounds = 0, to_owner = 0;
  for (const std::vector<planner::MuonRound>& of_group : *rounds) {
    for (const planner::MuonRound& round : of_group) {
      const int n = static_cast<int>(round.buckets.size());
      (round.scatter ? in_rounds : to_owner) += n;
      scatter += round.scatter;
    }
  }
  out << absl::StrFormat(
      "muon reduce      scatter rounds: %s shared Muon buckets in %s reduce-scatters, %s to their owners\n",
      WithThousands(in_rounds), WithThousands(scatter), WithThousands(to_owner));
}

// Per-block Newton-Schulz: the tensors with blocks, one row per kind
// (blocks, shape and TP handling), with how many there are and the first.
struct BlockedKind {
  std::string blocks;
  std::string shape;
  std::string tp;  // "-", "local" (ns_local) or "gather"
  int64_t tensors = 0;
  std::string first;
};

std::string ShapeText(const v1::PlannedTensor& t) { return absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]"); }

void PrintNsBlocks(const v1::Plan& plan, std::ostream& out) {
  std::vector<BlockedKind> kinds;
  double blocked = 0, whole = 0;
  const int steps = plan.policy().ns_steps();
  for (const v1::PlannedTensor& t : plan.tensors()) {
    if (!t.has_ns_blocks() || t.shape_size() < 2) continue;
    const int n = t.shape_size();
    const double matrices = n == 3 ? static_cast<double>(t.shape(0)) : 1;
    blocked += matrices * planner::BlockedNsFlops(&t.ns_blocks(), t.shape(n - 2), t.shape(n - 1), steps);
    whole += matrices * planner::NsFlops(t.shape(n - 2), t.shape(n - 1), steps);
    BlockedKind k{planner::NsBlocksText(t.ns_blocks()), ShapeText(t),
                  t.ns_local() ? "local" : (t.local_shape_size() > 0 ? "gather" : "-")};
    auto same = [&k](const BlockedKind& o) { return o.blocks == k.blocks && o.shape == k.shape && o.tp == k.tp; };
    auto it = std::find_if(kinds.begin(), kinds.end(), same);
    if (it == kinds.end()) {
      k.first = t.name();
      kinds.push_back(std::move(k));
      it = kinds.end() - 1;
    }
    ++it->tensors;
  }
  if (kinds.empty()) return;
  int64_t tensors = 0;
  for (const BlockedKind& k : kinds) tensors += k.tensors;
  out << absl::StrFormat("per-block NS     %s  NS per step %s GFLOP blocked vs %s GFLOP whole\n",
                         Count(tensors, "tensor", "tensors"), Gflop(blocked), Gflop(whole));
  out << absl::StrFormat("  %8s  %-32s %-20s %-6s  %s\n", "tensors", "blocks", "shape", "tp", "first");
  for (const BlockedKind& k : kinds) {
    out << absl::StrFormat("  %8s  %-32s %-20s %-6s  %s\n", WithThousands(k.tensors), k.blocks, k.shape, k.tp, k.first);
  }
}

int64_t ChangedTensors(const v1::PlanDiff& d) {
  return int64_t{d.owner_changed()} + d.slice_changed() + d.optimizer_changed() + d.shape_changed() + d.added() +
         d.removed();
}

}  // namespace

std::vector<Column> RankColumns(const v1::Plan& plan) {
  const auto r = [&plan](int i) -> const v1::RankPlan& { return plan.ranks(i); };
  return {
      IdColumn("rank", 6, "rank", [r](int i) { return r(i).rank(); }),
      IdColumn("stage", 5, "stage", [r](int i) { return r(i).stage(); }),
      IdColumn("ep", 4, "ep", [r](int i) { return r(i).ep_rank(); }),
      SizeColumn(
          "state_MiB", 14, "state", [r](int i) { return r(i).optimizer_state_bytes(); }, MibText),
      SizeColumn(
          "ns_GFLOP", 14, "flops", [r](int i) { return r(i).ns_flops(); }, GflopText),
      SizeColumn(
          "owned", 7, "owned", [r](int i) { return r(i).owned_size(); }, CountText),
      SizeColumn(
          "muon_elems", 16, "muon", [r](int i) { return r(i).muon_numel(); }, CountText),
      SizeColumn(
          "slice_elems", 16, "slice", [r](int i) { return r(i).adamw_numel(); }, CountText),
      SizeColumn(
          "memory_MiB", 14, "memory", [r](int i) { return r(i).memory().total_bytes(); }, MibText),
      Column{"headroom_MiB", 14, [r](int i) { return HeadroomText(r(i).memory()); }, "headroom", SortOrder::kAscending,
             [r](int i) { return static_cast<double>(r(i).memory().headroom_bytes()); }},
      SizeColumn(
          "buddy_MiB", 10, "buddy", [&plan](int i) { return BuddyBytes(plan, i); }, MibText),
  };
}

void RegisterRankOrder(FlagSet& flags, RowOrder* order) {
  order->Register(flags, RankColumns(v1::Plan::default_instance()));
}

absl::Status CheckRankOrder(const RowOrder& order, const std::string& output) {
  return order.Check(RankColumns(v1::Plan::default_instance()), output);
}

void PrintPlanSummary(const v1::Plan& plan, std::ostream& out) {
  const v1::PlanStats& s = plan.stats();
  out << absl::StrFormat("model %s  world %s  pp %d  ep %d%s  policy %s  buffer %s MiB\n", plan.model(),
                         WithThousands(plan.topology().world_size()), plan.topology().pp(), plan.topology().ep(),
                         plan.topology().tp() > 1 ? absl::StrFormat("  tp %d", plan.topology().tp()) : "",
                         v1::Policy_Name(plan.policy().policy()), WithThousands(plan.policy().comm_buffer_mb()));
  out << absl::StrFormat("hash %s\n", plan.content_hash());
  out << absl::StrFormat("params %s (muon %s in %s tensors, adamw %s in %s tensors)\n", WithThousands(s.total_params()),
                         WithThousands(s.muon_params()), WithThousands(s.muon_tensors()),
                         WithThousands(s.adamw_params()), WithThousands(s.adamw_tensors()));
  out << absl::StrFormat(
      "optimizer state  max %s MiB  min %s MiB  mean %s MiB  (max-min)/max %.4f  "
      "max/mean %.3f  max/LB %.3f\n",
      Mib(s.max_state_bytes()), Mib(s.min_state_bytes()), Mib(s.mean_state_bytes()), s.memory_imbalance(),
      s.max_over_mean_state_bytes(), s.max_over_lb_state_bytes());
  out << absl::StrFormat(
      "newton-schulz    max %s GFLOP  min %s GFLOP  mean %s GFLOP  (max-min)/max %.4f  "
      "max/mean %.3f  max/LB %.3f\n",
      Gflop(s.max_ns_flops()), Gflop(s.min_ns_flops()), Gflop(s.mean_ns_flops()), s.flops_imbalance(),
      s.max_over_mean_ns_flops(), s.max_over_lb_ns_flops());
  PrintMemorySummary(plan, out);
  if (plan.topology().tp() > 1) PrintTpSummary(plan, out);
  if (plan.policy().muon_reduce() == v1::MUON_REDUCE_SCATTER_ROUNDS) PrintMuonRounds(plan, out);
  PrintNsBlocks(plan, out);
}

std::string MemoryTerms(const v1::RankMemory& m) {
  std::string text = absl::StrFormat(
      "model %s  grad %s  master %s  muon_momentum %s  adamw_moment %s  comm_buffer %s  ns_workspace %s  "
      "total %s MiB",
      Mib(m.model_bytes()), Mib(m.grad_bytes()), Mib(m.master_bytes()), Mib(m.muon_momentum_bytes()),
      Mib(m.adamw_moment_bytes()), Mib(m.comm_buffer_bytes()), Mib(m.ns_workspace_bytes()), Mib(m.total_bytes()));
  if (m.capacity_bytes() > 0) {
    absl::StrAppend(
        &text, absl::StrFormat("  capacity %s  headroom %s MiB", Mib(m.capacity_bytes()), Mib(m.headroom_bytes())));
  }
  return text;
}

void PrintPlanTable(const v1::Plan& plan, const RowOrder& order, std::ostream& out) {
  PrintPlanSummary(plan, out);
  out << "\n";
  if (plan.ranks_size() == 0) {
    out << "no ranks in the plan\n";
    return;
  }
  PrintTable(RankColumns(plan), plan.ranks_size(), order, "ranks", out);
}

std::string RankRanges(const google::protobuf::RepeatedPtrField<v1::Placement>& placements) {
  std::set<int> ranks;
  for (const v1::Placement& p : placements) ranks.insert(p.rank());
  if (ranks.empty()) return "-";
  std::vector<std::string> runs;
  for (auto it = ranks.begin(); it != ranks.end();) {
    const int first = *it;
    int last = first;
    for (++it; it != ranks.end() && *it == last + 1; ++it) last = *it;
    runs.push_back(first == last ? absl::StrCat(first) : absl::StrCat(first, "-", last));
  }
  return absl::StrJoin(runs, ",");
}

void PrintPlanDiff(const v1::PlanDiff& d, int limit, std::ostream& out) {
  out << absl::StrFormat(
      "v%d (world %s) -> v%d (world %s): %s unchanged, %s owner changed, %s slice changed, "
      "%s optimizer changed, %s shape changed, %s added, %s removed; %s MiB of optimizer "
      "state moves\n",
      d.from_version(), WithThousands(d.from_world_size()), d.to_version(), WithThousands(d.to_world_size()),
      WithThousands(d.unchanged_tensors()), WithThousands(d.owner_changed()), WithThousands(d.slice_changed()),
      WithThousands(d.optimizer_changed()), WithThousands(d.shape_changed()), WithThousands(d.added()),
      WithThousands(d.removed()), Mib(d.moved_state_bytes()));
  const int64_t changed = ChangedTensors(d);
  if (changed == 0) {
    out << "no tensor changes\n";
    return;
  }
  if (d.truncated()) {
    out << absl::StrFormat("the first %s of %s changed tensors (--limit %d; --limit 0 lists all)\n",
                           WithThousands(d.tensors_size()), WithThousands(changed), limit);
  }
  out << absl::StrFormat("\n%-18s %-60s %14s  %s\n", "change", "tensor", "moved_elems", "ranks");
  for (const v1::TensorDiff& t : d.tensors()) {
    out << absl::StrFormat("%-18s %-60s %14s  %s -> %s\n", v1::TensorChangeKind_Name(t.kind()), t.name(),
                           WithThousands(t.moved_elements()), RankRanges(t.from()), RankRanges(t.to()));
  }
}

}  // namespace muonshard::cli
