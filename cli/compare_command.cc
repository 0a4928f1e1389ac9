// `muonshardctl compare`: seed vs balanced plans of one manifest, side by side.
#include <iostream>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "coordinator/planner/plan_stats.h"
#include "coordinator/planner/planner.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::cli {
namespace {

struct Column {
  v1::Plan plan;
  double millis = 0;
  int64_t max_comm_bytes = 0;
};

absl::StatusOr<Column> PlanWith(v1::PlanRequest request, v1::Policy policy) {
  request.mutable_policy()->set_policy(policy);
  absl::Time start = absl::Now();
  auto plan = planner::ComputePlan(request);
  if (!plan.ok()) return plan.status();
  Column c;
  c.millis = absl::ToDoubleMilliseconds(absl::Now() - start);
  c.plan = *std::move(plan);
  for (const v1::RankPlan& r : c.plan.ranks()) {
    c.max_comm_bytes = std::max(c.max_comm_bytes, r.grad_reduce_bytes() + r.grad_reduce_scatter_bytes() +
                                                      r.param_broadcast_bytes() + r.param_all_gather_bytes());
  }
  return c;
}

}  // namespace

int RunCompare(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl compare --manifest M.json --world-size W [--pp P] [--ep E]\n"
      "         [--comm-buffer-mb 256] [--output table|json]\n"
      "Plans the manifest with the seed policy and with balanced and prints both.");
  PlanFlags plan_flags;
  plan_flags.Register(flags);
  std::string output = "table";
  flags.String("output", &output, "table | json");
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (absl::Status s = CheckOutputFormat(output); !s.ok()) return ReportError(s);
  auto request = plan_flags.ToRequest();
  if (!request.ok()) return ReportError(request.status());
  auto seed = PlanWith(*request, v1::SEED);
  if (!seed.ok()) return ReportError(seed.status());
  auto balanced = PlanWith(*request, v1::BALANCED);
  if (!balanced.ok()) return ReportError(balanced.status());
  const v1::PlanStats& a = seed->plan.stats();
  const v1::PlanStats& b = balanced->plan.stats();
  if (output == "json") {
    v1::PlanStats pair[2] = {a, b};
    std::cout << "{\"seed\": ";
    PrintJson(pair[0]);
    std::cout << ", \"balanced\": ";
    PrintJson(pair[1]);
    const planner::TightBounds tight = planner::ComputeTightBounds(seed->plan);
    std::cout << ", \"tight_lb_state_bytes\": " << tight.state_bytes << ", \"tight_lb_ns_flops\": " << tight.ns_flops;
    std::cout << ", \"seed_plan_ms\": " << seed->millis << ", \"balanced_plan_ms\": " << balanced->millis
              << ", \"seed_max_comm_bytes\": " << seed->max_comm_bytes
              << ", \"balanced_max_comm_bytes\": " << balanced->max_comm_bytes << "}\n";
    return kExitOk;
  }
  std::cout << absl::StrFormat("model %s  world %d  pp %d  ep %d\n", seed->plan.model(),
                               seed->plan.topology().world_size(), seed->plan.topology().pp(),
                               seed->plan.topology().ep());
  std::cout << absl::StrFormat("%-34s%14s%14s\n", "", "seed", "balanced");
  auto row = [](const char* what, double x, double y) {
    std::cout << absl::StrFormat("%-34s%14.3f%14.3f\n", what, x, y);
  };
  row("state bytes max/LB", a.max_over_lb_state_bytes(), b.max_over_lb_state_bytes());
  row("state bytes max/mean", a.max_over_mean_state_bytes(), b.max_over_mean_state_bytes());
  row("state bytes (max-min)/max", a.memory_imbalance(), b.memory_imbalance());
  row("state max MiB", a.max_state_bytes() / 1048576.0, b.max_state_bytes() / 1048576.0);
  row("NS FLOPs max/LB", a.max_over_lb_ns_flops(), b.max_over_lb_ns_flops());
  row("NS FLOPs max/mean", a.max_over_mean_ns_flops(), b.max_over_mean_ns_flops());
  row("NS FLOPs (max-min)/max", a.flops_imbalance(), b.flops_imbalance());
  row("NS max GFLOP", a.max_ns_flops() / 1e9, b.max_ns_flops() / 1e9);
  row("comm bytes/rank/step max (MiB)", seed->max_comm_bytes / 1048576.0, balanced->max_comm_bytes / 1048576.0);
  const planner::TightBounds tight = planner::ComputeTightBounds(seed->plan);
  row("state bytes max/LB* (tight bound)", a.max_state_bytes() / tight.state_bytes,
      b.max_state_bytes() / tight.state_bytes);
  row("NS FLOPs max/LB* (tight bound)", a.max_ns_flops() / tight.ns_flops, b.max_ns_flops() / tight.ns_flops);
  row("plan ms", seed->millis, balanced->millis);
  return kExitOk;
}

}  // namespace muonshard::cli
