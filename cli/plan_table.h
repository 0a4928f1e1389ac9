#ifndef MUONSHARD_CLI_PLAN_TABLE_H_
#define MUONSHARD_CLI_PLAN_TABLE_H_

#include <ostream>

#include "muonshard/v1/plan.pb.h"

namespace muonshard::cli {

// One row per rank (state MiB, NS GFLOP, owned count, slice elements) and the
// plan's imbalance figures.
void PrintPlanTable(const v1::Plan& plan, std::ostream& out);

// The summary lines alone (model, topology, policy, imbalance).
void PrintPlanSummary(const v1::Plan& plan, std::ostream& out);

}  // namespace muonshard::cli

#endif  // MUONSHARD_CLI_PLAN_TABLE_H_
