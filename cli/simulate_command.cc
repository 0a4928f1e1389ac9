// `muonshardctl simulate`: a plan's optimizer step on a cluster.
#include "cli/simulate_command.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/cli_common.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/ns_batches.h"
#include "plan/planner.h"
#include "sim/cluster.h"
#include "sim/cluster_json.h"
#include "sim/peer_programs.h"
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
  std::string strategies;
  std::string collectives = "auto";
  int muon_batch_mib = static_cast<int>(planner::kDefaultMuonBatchMib);
};

// PlanFlags::Register's flags, none required: a plan file replaces them.
void RegisterPlanInputs(FlagSet& flags, PlanFlags& p) {
  flags.String("manifest", &p.manifest, "model manifest to plan (instead of --plan), as `muonshardctl plan` takes");
  flags.Int("world-size", &p.world_size, "with --manifest: number of ranks (default: none, required with it)");
  flags.Int("pp", &p.pp, "with --manifest: pipeline stages");
  flags.Int("ep", &p.ep, "with --manifest: expert parallel degree");
  flags.Int("tp", &p.tp, "with --manifest: tensor parallel degree");
  flags.String("tp-muon", &p.tp_muon, "with --manifest and --tp: distributed | duplicated | sharded");
  flags.String("policy", &p.policy, "with --manifest: seed | seed-all | balanced");
  flags.String("muon-reduce", &p.muon_reduce, "with --manifest: owner | scatter-rounds (tp 1)");
  flags.Int("comm-buffer-mb", &p.comm_buffer_mb, "with --manifest: fusion bucket size in MiB");
  flags.Int("ns-steps", &p.ns_steps, "with --manifest: Newton-Schulz iterations in the FLOP model");
  flags.Bool("per-dtype", &p.per_dtype, "with --manifest: partition Muon tensors of each dtype separately");
  flags.StringList("muon-exclude", &p.exclude, "with --manifest: regex of tensors that use AdamW; repeatable");
  flags.String("device-memory", &p.device_memory, "with --manifest: device memory per rank, e.g. 80GiB");
}

std::vector<std::string> StrategyNames();

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
  flags.String("collectives", &f.collectives,
               "gloo clusters: auto (inside each node first where the plan's topology gives gpus_per_node) | flat "
               "(rings over all of a group's ranks), as the workers' --collectives");
  flags.Int("muon-batch-mib", &f.muon_batch_mib,
            "as the workers' --muon-batch-mib: the sequential step's Newton-Schulz batches across a rank's buckets, "
            "MiB of fp32 update each; 0: a bucket's at a time");
  flags.String("strategies", &f.strategies,
               absl::StrCat("compare strategies side by side instead: all, or a comma-separated list of ",
                            absl::StrJoin(StrategyNames(), ", ")));
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

// ---- --strategies: muonshard and the peers side by side ------------------

// One strategy the comparison runs: muonshard's plan of a policy under the
// --schedule schedules, Paddle's seed, or a peer (sim/peer_programs.h).
struct Strategy {
  std::string name;
  enum class Kind { kMuonshard, kPaddle, kPeer } kind = Kind::kPeer;
  v1::Policy policy = v1::BALANCED;
  sim::PeerStrategy peer = sim::PeerStrategy::kZero1;
};

std::vector<Strategy> KnownStrategies() {
  std::vector<Strategy> all = {{"muonshard-seed", Strategy::Kind::kMuonshard, v1::SEED},
                               {"muonshard-balanced", Strategy::Kind::kMuonshard, v1::BALANCED},
                               {"paddle-seed", Strategy::Kind::kPaddle, v1::SEED}};
  for (sim::PeerStrategy p : sim::AllPeerStrategies()) {
    all.push_back({sim::PeerStrategyName(p), Strategy::Kind::kPeer, v1::BALANCED, p});
  }
  return all;
}

std::vector<std::string> StrategyNames() {
  std::vector<std::string> names;
  for (const Strategy& s : KnownStrategies()) names.push_back(s.name);
  return names;
}

// "all" or a comma-separated list; INVALID_ARGUMENT naming every unknown name.
absl::StatusOr<std::vector<Strategy>> ParseStrategies(const std::string& value) {
  const std::vector<Strategy> known = KnownStrategies();
  if (absl::AsciiStrToLower(value) == "all") return known;
  std::vector<Strategy> out;
  std::vector<std::string> unknown;
  for (absl::string_view piece : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    const std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(piece));
    auto it = std::find_if(known.begin(), known.end(), [&](const Strategy& s) { return s.name == name; });
    if (it == known.end()) {
      unknown.push_back(absl::StrCat("\"", piece, "\""));
    } else {
      out.push_back(*it);
    }
  }
  if (!unknown.empty() || out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("flag --strategies: unknown strategy ",
                                                   unknown.empty() ? "(none given)" : absl::StrJoin(unknown, ", "),
                                                   " (known: all, ", absl::StrJoin(StrategyNames(), ", "), ")"));
  }
  return out;
}

// The plan of `policy`: the plan file's when it has that policy, else
// computed from --manifest. Plans are computed once per policy.
class PlanSource {
 public:
  explicit PlanSource(const SimulateFlags& f) : f_(f) {}

  absl::StatusOr<const v1::Plan*> Of(v1::Policy policy) {
    auto it = plans_.find(policy);
    if (it != plans_.end()) return &it->second;
    MUONSHARD_ASSIGN_OR_RETURN(v1::Plan plan, Load(policy, f_.plan_flags.tp_muon, f_.plan_flags.muon_reduce));
    return &plans_.emplace(policy, std::move(plan)).first->second;
  }

  // The seed plan Paddle runs: TP-split matrices gathered to one tp rank
  // (Paddle has no sharded Newton-Schulz) and every Muon bucket reduced to
  // its owner, so under --tp-muon sharded or --muon-reduce scatter-rounds the
  // job planned again with the distributed mode and owners.
  absl::StatusOr<const v1::Plan*> PaddleSeed() {
    MUONSHARD_ASSIGN_OR_RETURN(const v1::Plan* seed, Of(v1::SEED));
    const bool rounds = seed->policy().muon_reduce() == v1::MUON_REDUCE_SCATTER_ROUNDS;
    if (seed->policy().tp_muon() != v1::TP_MUON_SHARDED && !rounds) return seed;
    if (!paddle_.has_value()) {
      if (!f_.plan.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --strategies: paddle-seed of a ", rounds ? "MUON_REDUCE_SCATTER_ROUNDS" : "TP_MUON_SHARDED",
            " plan file needs --manifest (Paddle ",
            rounds ? "reduces each bucket to its owner" : "gathers TP-split matrices", ")"));
      }
      MUONSHARD_ASSIGN_OR_RETURN(paddle_, Load(v1::SEED, "distributed", "owner"));
    }
    return &*paddle_;
  }

  // Any plan of the job (the peers read its tensors and groups only).
  absl::StatusOr<const v1::Plan*> Any() {
    if (!plans_.empty()) return &plans_.begin()->second;
    if (!f_.plan.empty()) {
      v1::Plan plan;
      MUONSHARD_RETURN_IF_ERROR(ReadMessageFile(f_.plan, &plan));
      const v1::Policy policy = plan.policy().policy();
      return &plans_.emplace(policy, std::move(plan)).first->second;
    }
    return Of(v1::BALANCED);
  }

 private:
  absl::StatusOr<v1::Plan> Load(v1::Policy policy, const std::string& tp_muon, const std::string& muon_reduce) {
    v1::Plan plan;
    if (!f_.plan.empty()) {
      MUONSHARD_RETURN_IF_ERROR(ReadMessageFile(f_.plan, &plan));
      if (plan.policy().policy() != policy) {
        return absl::InvalidArgumentError(absl::StrCat("flag --strategies: the plan file's policy is ",
                                                       v1::Policy_Name(plan.policy().policy()), "; a ",
                                                       v1::Policy_Name(policy), " plan needs --manifest"));
      }
    } else {
      PlanFlags p = f_.plan_flags;
      p.policy = absl::AsciiStrToLower(v1::Policy_Name(policy));
      p.tp_muon = tp_muon;
      p.muon_reduce = muon_reduce;
      MUONSHARD_ASSIGN_OR_RETURN(const v1::PlanRequest request, p.ToRequest());
      absl::StatusOr<v1::Plan> computed = planner::ComputePlan(request);
      if (!computed.ok()) {
        PrintFitHint(computed.status(), request);
        return computed.status();
      }
      plan = *std::move(computed);
    }
    return plan;
  }

  const SimulateFlags& f_;
  std::map<v1::Policy, v1::Plan> plans_;
  std::optional<v1::Plan> paddle_;
};

struct Row {
  std::string strategy;
  std::string schedule;  // muonshard's "sequential" / "pipelined"; a peer's own: "sequential", "overlapped"
  bool muonshard = false;
  bool whole_matrices = true;  // Muon's update (sim::OrthogonalisesWholeMatrices)
  sim::StepResult result;
};

absl::StatusOr<std::vector<Row>> RunStrategies(const std::vector<Strategy>& strategies,
                                               const std::vector<sim::Schedule>& schedules,
                                               const sim::ClusterSpec& cluster, PlanSource& plans,
                                               int64_t muon_batch_mib) {
  std::vector<Row> rows;
  for (const Strategy& s : strategies) {
    std::vector<std::pair<std::string, sim::StepProgram>> programs;
    bool whole = true;
    if (s.kind == Strategy::Kind::kMuonshard) {
      MUONSHARD_ASSIGN_OR_RETURN(const v1::Plan* plan, plans.Of(s.policy));
      for (sim::Schedule sched : schedules) {
        MUONSHARD_ASSIGN_OR_RETURN(sim::StepProgram p,
                                   sim::BuildPlanProgram(*plan, sched, sim::NsCalls::kWorker, muon_batch_mib));
        programs.emplace_back(sim::ScheduleName(sched), std::move(p));
      }
    } else if (s.kind == Strategy::Kind::kPaddle) {
      MUONSHARD_ASSIGN_OR_RETURN(const v1::Plan* plan, plans.PaddleSeed());
      MUONSHARD_ASSIGN_OR_RETURN(sim::StepProgram p, sim::BuildPaddleSeedProgram(*plan));
      programs.emplace_back("sequential", std::move(p));
    } else {
      MUONSHARD_ASSIGN_OR_RETURN(const v1::Plan* plan, plans.Any());
      MUONSHARD_ASSIGN_OR_RETURN(sim::StepProgram p, sim::BuildPeerProgram(*plan, s.peer));
      whole = sim::OrthogonalisesWholeMatrices(s.peer, plan->topology().tp());
      programs.emplace_back(s.peer == sim::PeerStrategy::kAllToAll ? "overlapped" : "sequential", std::move(p));
    }
    for (auto& [schedule, program] : programs) {
      MUONSHARD_RETURN_IF_ERROR(sim::CheckWorldFits(cluster, program.world_size));
      MUONSHARD_ASSIGN_OR_RETURN(sim::StepResult r, sim::RunStepProgram(std::move(program), cluster));
      r.program = {};  // the rows keep the figures only: a program of 10^5 ops per strategy adds up
      r.timing.clear();
      rows.push_back({s.name, schedule, s.kind == Strategy::Kind::kMuonshard, whole, std::move(r)});
    }
  }
  return rows;
}

// The fastest row of muonshard (`muonshard`) or of the peers whose update is
// Muon's; -1 if none.
int Best(const std::vector<Row>& rows, bool muonshard) {
  int best = -1;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].muonshard != muonshard || !rows[i].whole_matrices) continue;
    if (best < 0 || rows[i].result.step_seconds < rows[best].result.step_seconds) best = static_cast<int>(i);
  }
  return best;
}

double MaxWire(const sim::StepResult& r, sim::LinkClass link) {
  double most = 0;
  for (const sim::RankResult& rank : r.ranks) most = std::max(most, rank.wire_bytes[static_cast<int>(link)]);
  return most;
}

std::string CompareTable(const std::string& title, const std::string& cluster, const std::vector<Row>& rows) {
  constexpr double kMs = 1e3, kMiB = 1024.0 * 1024.0;
  const int peer = Best(rows, false);
  std::string out = absl::StrCat(title, "\n", cluster, "\n\n");
  absl::StrAppendFormat(&out, "%-24s %-11s %-6s %10s %9s %-7s %14s %14s\n", "strategy", "schedule", "update", "step ms",
                        "vs peer", "bound", "max intra MiB", "max inter MiB");
  for (const Row& row : rows) {
    const sim::StepResult& r = row.result;
    const std::string vs =
        peer >= 0 ? absl::StrFormat("%.2f", r.step_seconds / rows[peer].result.step_seconds) : std::string("-");
    absl::StrAppendFormat(&out, "%-24s %-11s %-6s %10.3f %9s %-7s %14.1f %14.1f\n", row.strategy, row.schedule,
                          row.whole_matrices ? "muon" : "shard", r.step_seconds * kMs, vs,
                          sim::PhaseName(r.critical_phase), MaxWire(r, sim::LinkClass::kIntraNode) / kMiB,
                          MaxWire(r, sim::LinkClass::kInterNode) / kMiB);
  }
  const int ours = Best(rows, true);
  absl::StrAppend(&out, "\nupdate shard: each TP shard orthogonalised alone (not Muon's update; not a best peer)\n");
  if (ours >= 0 && peer >= 0) {
    absl::StrAppendFormat(&out, "best muonshard %s %s %.3f ms; best peer %s %.3f ms; ratio %.2f (goal <= 0.80)\n",
                          rows[ours].strategy, rows[ours].schedule, rows[ours].result.step_seconds * kMs,
                          rows[peer].strategy, rows[peer].result.step_seconds * kMs,
                          rows[ours].result.step_seconds / rows[peer].result.step_seconds);
  }
  return out;
}

std::string RowJson(const Row& row) {
  const sim::StepResult& r = row.result;
  return absl::StrFormat(
      "{\"strategy\": \"%s\", \"schedule\": \"%s\", \"muonshard\": %s, \"whole_matrices\": %s, "
      "\"step_seconds\": %.9g, "
      "\"critical_rank\": %d, \"critical_phase\": \"%s\", \"max_intra_node_bytes\": %.0f, "
      "\"max_inter_node_bytes\": %.0f}",
      row.strategy, row.schedule, row.muonshard ? "true" : "false", row.whole_matrices ? "true" : "false",
      r.step_seconds, r.critical_rank, sim::PhaseName(r.critical_phase), MaxWire(r, sim::LinkClass::kIntraNode),
      MaxWire(r, sim::LinkClass::kInterNode));
}

std::string CompareJson(const std::string& title, const std::string& cluster, const std::vector<Row>& rows) {
  std::vector<std::string> items;
  items.reserve(rows.size());
  for (const Row& row : rows) items.push_back(RowJson(row));
  const int ours = Best(rows, true), peer = Best(rows, false);
  std::string out = absl::StrFormat("{\"title\": \"%s\", \"cluster\": \"%s\", \"strategies\": [\n  %s\n]",
                                    absl::CEscape(title), absl::CEscape(cluster), absl::StrJoin(items, ",\n  "));
  if (ours >= 0) absl::StrAppend(&out, ", \"best_muonshard\": ", RowJson(rows[ours]));
  if (peer >= 0) absl::StrAppend(&out, ", \"best_peer\": ", RowJson(rows[peer]));
  if (ours >= 0 && peer >= 0) {
    absl::StrAppendFormat(&out, ", \"ratio\": %.6g", rows[ours].result.step_seconds / rows[peer].result.step_seconds);
  }
  return absl::StrCat(out, "}\n");
}

int Compare(const FlagSet& flags, const SimulateFlags& f, const sim::ClusterSpec& cluster,
            const std::vector<sim::Schedule>& schedules) {
  if (!f.svg.empty()) return ReportError(absl::InvalidArgumentError("flag --svg: not with --strategies"));
  if (f.plan.empty() == !flags.WasSet("manifest")) {
    return ReportError(absl::InvalidArgumentError("give either --plan PLAN.json or --manifest M.json --world-size W"));
  }
  absl::StatusOr<std::vector<Strategy>> strategies = ParseStrategies(f.strategies);
  if (!strategies.ok()) return ReportError(strategies.status());
  PlanSource plans(f);
  absl::StatusOr<std::vector<Row>> rows = RunStrategies(*strategies, schedules, cluster, plans, f.muon_batch_mib);
  if (!rows.ok()) return ReportError(rows.status());
  absl::StatusOr<const v1::Plan*> any = plans.Any();
  if (!any.ok()) return ReportError(any.status());
  const v1::Topology& t = (*any)->topology();
  const std::string title = absl::StrFormat("model %s: world %d (pp %d, ep %d, tp %d)", (*any)->model(), t.world_size(),
                                            std::max(1, t.pp()), std::max(1, t.ep()), std::max(1, t.tp()));
  const std::string summary = sim::ClusterSummary(cluster, t.world_size());
  std::cout << (f.format == "json" ? CompareJson(title, summary, *rows) : CompareTable(title, summary, *rows));
  return kExitOk;
}

std::string Title(const v1::Plan& plan) {
  const v1::Topology& t = plan.topology();
  return absl::StrFormat("plan of model %s: world %d (pp %d, ep %d, tp %d), policy %s, %s", plan.model(),
                         t.world_size(), std::max(1, t.pp()), std::max(1, t.ep()), std::max(1, t.tp()),
                         v1::Policy_Name(plan.policy().policy()), plan.content_hash().substr(0, 19));
}

int Simulate(const FlagSet& flags, SimulateFlags f) {
  if (f.format != "table" && f.format != "json") {
    return ReportError(
        absl::InvalidArgumentError(absl::StrCat("flag --format: \"", f.format, "\" is not one of table, json")));
  }
  if (f.top < 0) return ReportError(absl::InvalidArgumentError("flag --top: must be >= 0"));
  if (f.muon_batch_mib < 0) {
    return ReportError(
        absl::InvalidArgumentError(absl::StrCat("flag --muon-batch-mib: ", f.muon_batch_mib, " is not >= 0")));
  }
  if (f.collectives != "auto" && f.collectives != "flat") {
    return ReportError(absl::InvalidArgumentError(
        absl::StrCat("flag --collectives: \"", f.collectives, "\" is not one of auto, flat")));
  }
  if (f.collectives == "flat" && flags.WasSet("strategies")) {
    return ReportError(absl::InvalidArgumentError("flag --collectives flat: not with --strategies"));
  }
  absl::StatusOr<std::vector<sim::Schedule>> schedules = Schedules(f.schedule);
  if (!schedules.ok()) return ReportError(schedules.status());
  absl::StatusOr<sim::ClusterSpec> cluster = ClusterOf(flags, f);
  if (!cluster.ok()) return ReportError(cluster.status());
  // A plan made here is made for the cluster's nodes (NOTE [Node-local
  // collectives] in plan/node_grid.h).
  f.plan_flags.gpus_per_node = cluster->gpus_per_node;
  if (flags.WasSet("strategies")) return Compare(flags, f, *cluster, *schedules);
  absl::StatusOr<v1::Plan> plan = PlanOf(flags, f);
  if (!plan.ok()) return ReportError(plan.status());
  // Flat: the plan's owners and buckets, its groups run as rings over their
  // ranks (NOTE [Node-local collectives] in plan/node_grid.h).
  if (f.collectives == "flat") plan->mutable_topology()->set_gpus_per_node(0);
  std::vector<sim::StepResult> results;
  for (sim::Schedule s : *schedules) {
    absl::StatusOr<sim::StepResult> r = sim::SimulateStep(*plan, *cluster, s, f.muon_batch_mib);
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
      "         [--collectives auto|flat]\n"
      "         [--strategies all|LIST]\n"
      "Predicts a plan's optimizer step on a cluster: per rank each phase, the sequential and the pipelined\n"
      "step, the critical path and the bytes per link class (docs/simulator.md). With --strategies, the step\n"
      "of muonshard (seed, balanced) and of the peers (Paddle, Megatron, KellerJordan, Dion, ZeRO-1) on the\n"
      "same job and cluster, side by side.");
  SimulateFlags f;
  Register(flags, f);
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (!positional.empty()) return UsageError(flags, "simulate takes no positional arguments");
  return Simulate(flags, f);
}

}  // namespace muonshard::cli
