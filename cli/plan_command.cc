// `muonshardctl plan`: computes a plan locally and prints it.
#include <cstdio>
#include <iostream>

#include "absl/strings/str_format.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cli/plan_table.h"
#include "coordinator/planner/plan_view.h"
#include "coordinator/planner/planner.h"

namespace muonshard::cli {

int RunPlan(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl plan --manifest M.json --world-size W [--pp P] [--ep E]\n"
      "         [--policy seed|seed-all|balanced] [--comm-buffer-mb 256] [--output table|json]");
  PlanFlags plan_flags;
  plan_flags.Register(flags);
  std::string output = "table";
  flags.String("output", &output, "table | json");
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (!positional.empty()) {
    return ReportError(absl::InvalidArgumentError("plan takes no positional arguments"));
  }
  if (absl::Status s = CheckOutputFormat(output); !s.ok()) return ReportError(s);
  auto request = plan_flags.ToRequest();
  if (!request.ok()) return ReportError(request.status());
  auto plan = planner::ComputePlan(*request);
  if (!plan.ok()) return ReportError(plan.status());
  if (output == "json") {
    planner::AddDisplayNames(&*plan);
    return PrintJson(*plan);
  }
  PrintPlanTable(*plan, std::cout);
  return kExitOk;
}

}  // namespace muonshard::cli
