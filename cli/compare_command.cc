// `muonshardctl compare`: seed vs balanced plans of one manifest, side by side.
#include <algorithm>
#include <iostream>
#include <ostream>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "common/ordered_json.h"
#include "common/proto_json.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/plan_stats.h"
#include "plan/planner.h"

namespace muonshard::cli {
namespace {

struct PolicyRun {
  v1::Plan plan;
  double millis = 0;
  int64_t max_comm_bytes = 0;
};

absl::StatusOr<PolicyRun> PlanWith(v1::PlanRequest request, v1::Policy policy) {
  request.mutable_policy()->set_policy(policy);
  absl::Time start = absl::Now();
  auto plan = planner::ComputePlan(request);
  if (!plan.ok()) return plan.status();
  PolicyRun c;
  c.millis = absl::ToDoubleMilliseconds(absl::Now() - start);
  c.plan = *std::move(plan);
  for (const v1::RankPlan& r : c.plan.ranks()) {
    c.max_comm_bytes = std::max(c.max_comm_bytes, r.grad_reduce_bytes() + r.grad_reduce_scatter_bytes() +
                                                      r.param_broadcast_bytes() + r.param_all_gather_bytes());
  }
  return c;
}

// One object: each policy's PlanStats as its proto3 JSON, then the tight
// bounds and timings (doubles, exact) and the busiest rank's comm bytes
// (int64: strings, as in every proto3 JSON).
int PrintCompareJson(const PolicyRun& seed, const PolicyRun& balanced, const planner::TightBounds& tight) {
  absl::StatusOr<std::string> a = ToJson(seed.plan.stats());
  if (!a.ok()) return ReportError(a.status());
  absl::StatusOr<std::string> b = ToJson(balanced.plan.stats());
  if (!b.ok()) return ReportError(b.status());
  std::cout << JsonObjectWriter()
                   .Raw("seed", *a)
                   .Raw("balanced", *b)
                   .Number("tight_lb_state_bytes", tight.state_bytes)
                   .Number("tight_lb_ns_flops", tight.ns_flops)
                   .Number("seed_plan_ms", seed.millis)
                   .Number("balanced_plan_ms", balanced.millis)
                   .Int64("seed_max_comm_bytes", seed.max_comm_bytes)
                   .Int64("balanced_max_comm_bytes", balanced.max_comm_bytes)
                   .Finish()
            << "\n";
  return kExitOk;
}

// The topology first, then one row per figure, seed and balanced side by side.
void PrintCompareTable(const PolicyRun& seed, const PolicyRun& balanced, const planner::TightBounds& tight,
                       std::ostream& out) {
  const v1::PlanStats& a = seed.plan.stats();
  const v1::PlanStats& b = balanced.plan.stats();
  const v1::Topology& topology = seed.plan.topology();
  out << absl::StrFormat("model %s  world %s  pp %d  ep %d%s\n\n", seed.plan.model(),
                         WithThousands(topology.world_size()), topology.pp(), topology.ep(),
                         topology.tp() > 1 ? absl::StrFormat("  tp %d", topology.tp()) : "");
  out << absl::StrFormat("%-34s%14s%14s\n", "", "seed", "balanced");
  auto row = [&out](const char* what, double x, double y) {
    out << absl::StrFormat("%-34s%14s%14s\n", what, FixedWithThousands(x, 3), FixedWithThousands(y, 3));
  };
  constexpr double kMiB = 1024.0 * 1024.0;
  row("state bytes max/LB", a.max_over_lb_state_bytes(), b.max_over_lb_state_bytes());
  row("state bytes max/mean", a.max_over_mean_state_bytes(), b.max_over_mean_state_bytes());
  row("state bytes (max-min)/max", a.memory_imbalance(), b.memory_imbalance());
  row("state max MiB", a.max_state_bytes() / kMiB, b.max_state_bytes() / kMiB);
  row("NS FLOPs max/LB", a.max_over_lb_ns_flops(), b.max_over_lb_ns_flops());
  row("NS FLOPs max/mean", a.max_over_mean_ns_flops(), b.max_over_mean_ns_flops());
  row("NS FLOPs (max-min)/max", a.flops_imbalance(), b.flops_imbalance());
  row("NS max GFLOP", a.max_ns_flops() / 1e9, b.max_ns_flops() / 1e9);
  row("comm bytes/rank/step max (MiB)", seed.max_comm_bytes / kMiB, balanced.max_comm_bytes / kMiB);
  row("state bytes max/LB* (tight bound)", a.max_state_bytes() / tight.state_bytes,
      b.max_state_bytes() / tight.state_bytes);
  row("NS FLOPs max/LB* (tight bound)", a.max_ns_flops() / tight.ns_flops, b.max_ns_flops() / tight.ns_flops);
  row("plan ms", seed.millis, balanced.millis);
}

}  // namespace

int RunCompare(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl compare --manifest M.json --world-size W [--pp P] [--ep E]\n"
      "         [--comm-buffer-mb 256] [--output table|json]\n"
      "Plans the manifest with the seed policy and with balanced and prints both\n"
      "(so it takes no --policy).");
  PlanFlags plan_flags;
  plan_flags.Register(flags);
  flags.Hide("policy");  // taken only to be refused below
  std::string output = "table";
  flags.String("output", &output, "table | json");
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (absl::Status s = CheckOutputFormat(output); !s.ok()) return ReportError(s);
  // Both policies always run: a --policy would be silently ignored.
  if (flags.WasSet("policy")) {
    return ReportError(absl::InvalidArgumentError("compare runs both policies; --policy is not used"));
  }
  auto request = plan_flags.ToRequest();
  if (!request.ok()) return ReportError(request.status());
  auto seed = PlanWith(*request, v1::SEED);
  if (!seed.ok()) return ReportError(seed.status());
  auto balanced = PlanWith(*request, v1::BALANCED);
  if (!balanced.ok()) return ReportError(balanced.status());
  const planner::TightBounds tight = planner::ComputeTightBounds(seed->plan);
  if (output == "json") return PrintCompareJson(*seed, *balanced, tight);
  PrintCompareTable(*seed, *balanced, tight, std::cout);
  return kExitOk;
}

}  // namespace muonshard::cli
