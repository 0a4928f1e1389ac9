// `muonshardctl plan`: computes a plan locally and prints it.
#include <cstdio>
#include <iostream>
#include <memory>

#include "absl/strings/str_format.h"
#include "cli/cli_common.h"
#include "cli/commands.h"
#include "cli/plan_table.h"
#include "common/status_macros.h"
#include "plan/plan_view.h"
#include "plan/planner.h"
#include "plan/transfer.h"

namespace muonshard::cli {

namespace {

// Sticky re-planning: state that moves from the previous plan under the
// sticky plan and under a from-scratch plan of the same request (stderr, so
// --output json stays a plan).
absl::Status ReportMoves(const v1::Plan& previous, const v1::Plan& sticky, v1::PlanRequest request) {
  request.mutable_policy()->clear_sticky_to();
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan scratch, planner::ComputePlan(request));
  MUONSHARD_ASSIGN_OR_RETURN(planner::TransferSummary kept, planner::ComputeTransfers(previous, sticky));
  MUONSHARD_ASSIGN_OR_RETURN(planner::TransferSummary fresh, planner::ComputeTransfers(previous, scratch));
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::cerr << absl::StrFormat(
      "state moved from the previous plan: sticky %.3f GiB (%.1f%%), from scratch %.3f GiB (%.1f%%); "
      "max/LB bytes %.3f vs %.3f, FLOPs %.3f vs %.3f\n",
      kept.moved_bytes / kGiB, 100.0 * kept.moved_bytes / std::max<int64_t>(kept.state_bytes, 1),
      fresh.moved_bytes / kGiB, 100.0 * fresh.moved_bytes / std::max<int64_t>(fresh.state_bytes, 1),
      sticky.stats().max_over_lb_state_bytes(), scratch.stats().max_over_lb_state_bytes(),
      sticky.stats().max_over_lb_ns_flops(), scratch.stats().max_over_lb_ns_flops());
  return absl::OkStatus();
}

}  // namespace

int RunPlan(const std::vector<std::string>& args) {
  FlagSet flags(
      "usage: muonshardctl plan --manifest M.json --world-size W [--pp P] [--ep E]\n"
      "         [--policy seed|seed-all|balanced] [--comm-buffer-mb 256] [--output table|json]\n"
      "         [--device-memory 80GiB]  (each rank's headroom; a plan that does not fit is refused)\n"
      "         [--sort KEY] [--top N]   (the per-rank table's order and length)\n"
      "         [--previous PLAN.json]   (sticky re-planning: keep PLAN's owners where balance allows)");
  PlanFlags plan_flags;
  plan_flags.Register(flags);
  std::string output = "table";
  flags.String("output", &output, "table | json");
  std::string previous_path;
  flags.String("previous", &previous_path,
               "a previous plan (JSON or .pb) to stay close to (sticky re-planning; policy balanced)");
  RowOrder rows;
  RegisterRankOrder(flags, &rows);
  std::vector<std::string> positional;
  if (int rc = ParseFlagsOrExit(flags, args, &positional); rc >= 0) return rc;
  if (!positional.empty()) {
    return ReportError(absl::InvalidArgumentError("plan takes no positional arguments"));
  }
  if (absl::Status s = CheckOutputFormat(output); !s.ok()) return ReportError(s);
  if (absl::Status s = CheckRankOrder(rows, output); !s.ok()) return ReportError(s);
  auto request = plan_flags.ToRequest();
  if (!request.ok()) return ReportError(request.status());
  v1::Plan previous;
  if (!previous_path.empty()) {
    if (absl::Status s = ReadMessageFile(previous_path, &previous); !s.ok()) return ReportError(s);
    request->mutable_policy()->set_sticky_to(previous.content_hash());
  }
  auto computed = planner::ComputePlan(*request, nullptr, previous_path.empty() ? nullptr : &previous);
  if (!computed.ok()) {
    const int rc = ReportError(computed.status());
    PrintFitHint(computed.status(), *request);
    return rc;
  }
  std::unique_ptr<v1::Plan> plan(*computed);
  if (!previous_path.empty()) {
    if (absl::Status s = ReportMoves(previous, *plan, *request); !s.ok()) return ReportError(s);
  }
  if (output == "json") {
    planner::AddDisplayNames(plan.get());
    return PrintJson(*plan);
  }
  PrintPlanTable(*plan, rows, std::cout);
  return kExitOk;
}

}  // namespace muonshard::cli
