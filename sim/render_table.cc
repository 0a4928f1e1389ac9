// The text table of sim/render.h.
#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sim/render.h"

namespace muonshard::sim {
namespace {

constexpr double kMs = 1e3;
constexpr double kMiB = 1024.0 * 1024.0;

std::string LinkText(const LinkSpec& link) {
  return absl::StrFormat("%g GB/s x %.2f, %g us/step", link.bandwidth_gb_s, link.efficiency, link.latency_us);
}

// "ns 0.700, reduce 0.300": the phases of the critical path, largest first.
std::string CriticalPhases(const StepResult& r) {
  std::vector<int> phases(kPhaseCount);
  std::iota(phases.begin(), phases.end(), 0);
  std::stable_sort(phases.begin(), phases.end(),
                   [&](int a, int b) { return r.critical_seconds[a] > r.critical_seconds[b]; });
  std::vector<std::string> parts;
  for (int ph : phases) {
    if (r.critical_seconds[ph] <= 0) continue;
    parts.push_back(absl::StrFormat("%s %.3f", PhaseName(static_cast<Phase>(ph)), r.critical_seconds[ph] * kMs));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

// The longest op of the critical path: "ns M3 r2 0.500".
std::string LongestOnPath(const StepResult& r) {
  int longest = -1;
  double most = -1;
  for (int op : r.critical_path) {
    const double d = r.timing[op].end - r.timing[op].start;
    if (d > most) {
      most = d;
      longest = op;
    }
  }
  if (longest < 0) return "-";
  return absl::StrFormat("%s %.3f", r.program.ops[longest].label, most * kMs);
}

std::string SummaryLines(absl::Span<const StepResult> results) {
  std::string out = absl::StrFormat("%-22s %10s %14s  %s\n", "schedule", "step ms", "critical rank",
                                    "critical path (ms by phase; its longest op)");
  for (const StepResult& r : results) {
    absl::StrAppendFormat(&out, "%-22s %10.3f %14d  %s; %s\n", r.program.name, r.step_seconds * kMs, r.critical_rank,
                          CriticalPhases(r), LongestOnPath(r));
  }
  return out;
}

// The ranks to list: all, or the `top` slowest of the last result.
std::vector<int> RowsOf(absl::Span<const StepResult> results, int top, std::string* note) {
  const std::vector<RankResult>& ranks = results.back().ranks;
  std::vector<int> rows(ranks.size());
  std::iota(rows.begin(), rows.end(), 0);
  if (top <= 0 || top >= static_cast<int>(rows.size())) return rows;
  std::stable_sort(rows.begin(), rows.end(),
                   [&](int a, int b) { return ranks[a].finish_seconds > ranks[b].finish_seconds; });
  rows.resize(top);
  *note = absl::StrFormat("the %d slowest of %d ranks (%s)\n", top, ranks.size(), results.back().program.name);
  return rows;
}

std::string RankTable(absl::Span<const StepResult> results, int top) {
  std::string note;
  const std::vector<int> rows = RowsOf(results, top, &note);
  std::string out = "per rank: busy ms per phase (they overlap when pipelined); MiB sent per link class\n" + note;
  absl::StrAppendFormat(&out, "%5s %5s", "rank", "node");
  for (const StepResult& r : results) absl::StrAppendFormat(&out, " %22s", absl::StrCat(r.program.name, " ms"));
  for (int ph = 0; ph < kPhaseCount - 1; ++ph) absl::StrAppendFormat(&out, " %8s", PhaseName(static_cast<Phase>(ph)));
  absl::StrAppendFormat(&out, " %10s %10s\n", "intra MiB", "inter MiB");
  for (int row : rows) {
    const RankResult& first = results.front().ranks[row];
    absl::StrAppendFormat(&out, "%5d %5d", first.rank, first.node);
    for (const StepResult& r : results) absl::StrAppendFormat(&out, " %22.3f", r.ranks[row].finish_seconds * kMs);
    for (int ph = 0; ph < kPhaseCount - 1; ++ph) absl::StrAppendFormat(&out, " %8.3f", first.busy_seconds[ph] * kMs);
    absl::StrAppendFormat(&out, " %10.3f %10.3f\n", first.wire_bytes[0] / kMiB, first.wire_bytes[1] / kMiB);
  }
  return out;
}

}  // namespace

std::string ClusterSummary(const ClusterSpec& c, int world_size) {
  const int used = NodesUsed(c, world_size);
  const std::string nodes = c.nodes > 0 ? absl::StrFormat("%d of %d nodes", used, c.nodes)
                                        : absl::StrFormat("%d node%s", used, used == 1 ? "" : "s");
  return absl::StrFormat(
      "cluster %s: %s x %d GPUs for %d ranks; intra-node %s; inter-node %s; %s, algorithm %s%s; GEMM %g TFLOP/s; "
      "HBM %g GB/s x %.2f",
      c.name, nodes, c.gpus_per_node, world_size, LinkText(c.intra_node), LinkText(c.inter_node),
      LibraryName(c.library), AlgorithmName(c.algorithm), c.nvls ? ", NVLS" : "", c.gemm_tflops, c.hbm_gb_s,
      c.hbm_efficiency);
}

std::string RenderTable(const ClusterSpec& cluster, absl::Span<const StepResult> results,
                        const ReportOptions& options) {
  if (results.empty()) return "no schedules simulated\n";
  std::string out;
  if (!options.title.empty()) out = options.title + "\n";
  absl::StrAppend(&out, ClusterSummary(cluster, results.front().program.world_size), "\n\n");
  absl::StrAppend(&out, SummaryLines(results), "\n", RankTable(results, options.top));
  return out;
}

}  // namespace muonshard::sim
