#ifndef MUONSHARD_SIM_RENDER_H_
#define MUONSHARD_SIM_RENDER_H_

// The simulator's reports, as pure functions returning text: a table for
// people, JSON for scripts, and an SVG timeline per schedule (one band per
// rank, a row per lane, ops coloured by phase, the critical path outlined,
// each op's name and times in its tooltip). Each takes the results of one
// plan under one or more schedules (the same program ops and ranks).

#include <string>

#include "absl/types/span.h"
#include "sim/cluster.h"
#include "sim/simulator.h"

namespace muonshard::sim {

struct ReportOptions {
  // What was simulated, the report's first line ("model dense, world 4, ...").
  std::string title;
  // The table's rows: the `top` slowest ranks of the last result (0: all).
  int top = 0;
  // The timeline's bands: at most this many ranks, the slowest (with the
  // critical rank), in rank order.
  int svg_max_ranks = 64;
};

// One line: the cluster and how many of its nodes `world_size` ranks use.
std::string ClusterSummary(const ClusterSpec& cluster, int world_size);

std::string RenderTable(const ClusterSpec& cluster, absl::Span<const StepResult> results, const ReportOptions& options);
// {"title", "cluster" (ClusterToJson), "nodes_used", "schedules": [{"schedule",
// "step_seconds", "critical_rank", "critical_phase", "critical_seconds",
// "critical_path", "ranks": [...]}]}; int64 byte counts as strings, as in
// the project's proto3 JSON.
std::string RenderJson(const ClusterSpec& cluster, absl::Span<const StepResult> results, const ReportOptions& options);
std::string RenderSvg(const ClusterSpec& cluster, absl::Span<const StepResult> results, const ReportOptions& options);

}  // namespace muonshard::sim

#endif  // MUONSHARD_SIM_RENDER_H_
