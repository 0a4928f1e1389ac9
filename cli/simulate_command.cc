// `muonshardctl simulate`: a plan's optimizer step on a cluster.
#include "cli/simulate_command.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/cli_common.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/planner.h"
#include "sim/cluster.h"
#include "sim/cluster_json.h"
#include "sim/render.h"
#include "sim/simulate_step.h"

namespace muonshard::cli {
namespace {

struct SimulateFlags {
  std::string plan;
  PlanFlags plan_flags;
  std::string cluster;
  int gpus_per_node = 0;
  int nodes = 0;
  double intra_bandwidth = 0;
  double inter_bandwidth = 0;
  std::string algorithm;
  std::string schedule = "both";
  std::string format = "table";
  std::string svg;
  int top = 0;
};

// PlanFlags::Register's flags, none required: a plan file replaces them.
void RegisterPlanInputs(FlagSet& flags, PlanFlags& p) {
  flags.String("manifest", &p.manifest, "model manifest to plan (instead of --plan), as `muonshardctl plan` takes");
  flags.Int("world-size", &p.world_size, "with --manifest: number of ranks (default: none, required with it)");
  flags.Int("pp", &p.pp, "with --manifest: pipeline stages");
  flags.Int("ep", &p.ep, "with --manifest: expert parallel degree");
  flags.Int("tp", &p.tp, "with --manifest: tensor parallel degree");
  flags.String("tp-muon", &p.tp_muon, "with --manifest and --tp: distributed | duplicated");
  flags.String("policy", &p.policy, "with --manifest: seed | seed-all | balanced");
  flags.Int("comm-buffer-mb", &p.comm_buffer_mb, "with --manifest: fusion bucket size in MiB");
  flags.Int("ns-steps", &p.ns_steps, "with --manifest: Newton-Schulz iterations in the FLOP model");
  flags.Bool("per-dtype", &p.per_dtype, "with --manifest: partition Muon tensors of each dtype separately");
  flags.StringList("muon-exclude", &p.exclude, "with --manifest: regex of tensors that use AdamW; repeatable");
  flags.String("device-memory", &p.device_memory, "with --manifest: device memory per rank, e.g. 80GiB");
}

void Register(FlagSet& flags, SimulateFlags& f) {
  flags.String("plan", &f.plan, "a plan (JSON, or binary proto ending in .pb), e.g. from `muonshardctl plan`");
  RegisterPlanInputs(flags, f.plan_flags);
  flags.String("cluster", &f.cluster,
               absl::StrCat("a preset (", absl::StrJoin(sim::PresetNames(), ", "),
                            ") or a cluster file (JSON: a preset and the fields it overrides)"));
  flags.Required("cluster");
  flags.Int("gpus-per-node", &f.gpus_per_node, "GPUs (ranks) per node (default: the cluster's)");
  flags.Int("nodes", &f.nodes, "nodes; 0: as many as the plan needs (default: the cluster's)");
  flags.Double("intra-bandwidth", &f.intra_bandwidth,
               "intra-node bandwidth, GB/s per GPU and direction (default: the cluster's)");
  flags.Double("inter-bandwidth", &f.inter_bandwidth,
               "inter-node bandwidth, GB/s per GPU and direction (default: the cluster's)");
  flags.String("algorithm", &f.algorithm, "collective algorithm: auto | ring | tree | nvls (default: the cluster's)");
  flags.String("schedule", &f.schedule, "sequential | pipelined | both");
  flags.String("format", &f.format, "table | json");
  flags.String("output", &f.format, "table | json (the same as --format)");
  flags.Hide("output");
  flags.String("svg", &f.svg, "also write the per-rank timeline here (SVG)");
  flags.Int("top", &f.top, "table: only the N slowest ranks (0: all)");
}

absl::StatusOr<std::vector<sim::Schedule>> Schedules(const std::string& name) {
  if (absl::AsciiStrToLower(name) == "both")
    return std::vector<sim::Schedule>{sim::Schedule::kSequential, sim::Schedule::kPipelined};
  absl::StatusOr<sim::Schedule> one = sim::ParseSchedule(name);
  if (!one.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("flag --schedule: \"", name, "\" is not one of sequential, pipelined, both"));
  return std::vector<sim::Schedule>{*one};
}

// A preset name, else a cluster file.
absl::StatusOr<sim::ClusterSpec> LoadCluster(const std::string& value) {
  const std::vector<std::string> presets = sim::PresetNames();
  if (std::find(presets.begin(), presets.end(), absl::AsciiStrToLower(value)) != presets.end()) {
    return sim::Preset(value);
  }
  absl::StatusOr<std::string> text = ReadFile(value);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("flag --cluster: \"", value, "\" is neither a preset (",
                                                   absl::StrJoin(presets, ", "), ") nor a readable cluster file (",
                                                   text.status().message(), ")"));
  }
  absl::StatusOr<sim::ClusterSpec> cluster = sim::ParseClusterJson(*text);
  if (!cluster.ok()) return absl::InvalidArgumentError(absl::StrCat(value, ": ", cluster.status().message()));
  return cluster;
}

absl::StatusOr<sim::ClusterSpec> ClusterOf(const FlagSet& flags, const SimulateFlags& f) {
  MUONSHARD_ASSIGN_OR_RETURN(sim::ClusterSpec c, LoadCluster(f.cluster));
  if (flags.WasSet("gpus-per-node")) c.gpus_per_node = f.gpus_per_node;
  if (flags.WasSet("nodes")) c.nodes = f.nodes;
  if (flags.WasSet("intra-bandwidth")) c.intra_node.bandwidth_gb_s = f.intra_bandwidth;
  if (flags.WasSet("inter-bandwidth")) c.inter_node.bandwidth_gb_s = f.inter_bandwidth;
  if (flags.WasSet("algorithm")) {
    absl::StatusOr<sim::Algorithm> a = sim::ParseAlgorithm(f.algorithm);
    if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat("flag --algorithm: ", a.status().message()));
    c.algorithm = *a;
  }
  MUONSHARD_RETURN_IF_ERROR(sim::ValidateCluster(c));
  return c;
}

// The plan file, or the plan of --manifest and the topology flags.
absl::StatusOr<v1::Plan> PlanOf(const FlagSet& flags, const SimulateFlags& f) {
  const bool from_manifest = flags.WasSet("manifest");
  if (f.plan.empty() == !from_manifest) {
    return absl::InvalidArgumentError("give either --plan PLAN.json or --manifest M.json --world-size W");
  }
  v1::Plan plan;
  if (!f.plan.empty()) {
    MUONSHARD_RETURN_IF_ERROR(ReadMessageFile(f.plan, &plan));
    return plan;
  }
  MUONSHARD_ASSIGN_OR_RETURN(const v1::PlanRequest request, f.plan_flags.ToRequest());
  absl::StatusOr<v1::Plan> computed = planner::ComputePlan(request);
  if (!computed.ok()) PrintFitHint(computed.status(), request);
  return computed;
}

std::string Title(const v1::Plan& plan) {
  const v1::Topology& t = plan.topology();
  return absl::StrFormat("plan of model %s: world %d (pp %d, ep %d, tp %d), policy %s, %s", plan.model(),
                         t.world_size(), std::max(1, t.pp()), std::max(1, t.ep()), std::max(1, t.tp()),
                         v1::Policy_Name(plan.policy().policy()), plan.content_hash().substr(0, 19));
}

int Simulate(const FlagSet& flags, const SimulateFlags& f) {
  if (f.format != "table" && f.format != "json") {
    return ReportError(
        absl::InvalidArgumentError(absl::StrCat("flag --format: \"", f.format, "\" is not one of table, json")));
  }
  if (f.top < 0) return ReportError(absl::InvalidArgumentError("flag --top: must be >= 0"));
  absl::StatusOr<std::vector<sim::Schedule>> schedules = Schedules(f.schedule);
  if (!schedules.ok()) return ReportError(schedules.status());
  absl::StatusOr<sim::ClusterSpec> cluster = ClusterOf(flags, f);
  if (!cluster.ok()) return ReportError(cluster.status());
  absl::StatusOr<v1::Plan> plan = PlanOf(flags, f);
  if (!plan.ok()) return ReportError(plan.status());
  std::vector<sim::StepResult> results;
  for (sim::Schedule s : *schedules) {
    absl::StatusOr<sim::StepResult> r = sim::SimulateStep(*plan, *cluster, s);
    if (!r.ok()) return ReportError(r.status());
    results.push_back(*std::move(r));
  }
  sim::ReportOptions options;
  options.title = Title(*plan);
  options.top = f.top;
  if (!f.svg.empty()) {
    absl::Status s = WriteFileAtomic(f.svg, sim::RenderSvg(*cluster, results, options));
    if (!s.ok()) return ReportError(s);
  }
  std::cout << (f.format == "json" ? sim::RenderJson(*cluster, results, options)
                                   : sim::RenderTable(*cluster, results, options));
  return kExitOk;
}

}  // namespace

int RunSimulate(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl simulate --cluster PRESET|FILE (--plan PLAN.json | --manifest M.json --world-size W ...)\n"
      "         [--schedule sequential|pipelined|both] [--format table|json] [--svg FILE] [--top N]\n"
      "         [--gpus-per-node N] [--nodes N] [--intra-bandwidth GB/s] [--inter-bandwidth GB/s] [--algorithm A]\n"
      "Predicts a plan's optimizer step on a cluster: per rank each phase, the sequential and the pipelined\n"
      "step, the critical path and the bytes per link class (docs/simulator.md).");
  SimulateFlags f;
  Register(flags, f);
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (!positional.empty()) return UsageError(flags, "simulate takes no positional arguments");
  return Simulate(flags, f);
}

}  // namespace muonshard::cli
