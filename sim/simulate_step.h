#ifndef MUONSHARD_SIM_SIMULATE_STEP_H_
#define MUONSHARD_SIM_SIMULATE_STEP_H_

// muonshard's optimizer step on a cluster, from its plan: BuildPlanProgram
// (sim/plan_program.h) run by RunStepProgram (sim/simulator.h).

#include <cstdint>

#include "absl/status/statusor.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/ns_batches.h"
#include "sim/cluster.h"
#include "sim/plan_program.h"
#include "sim/simulator.h"

namespace muonshard::sim {

// `muon_batch_mib`: the workers' (NOTE [Muon batches] in plan/ns_batches.h).
// INVALID_ARGUMENT for a bad cluster (naming the field), a plan whose world
// size does not fit it (naming nodes), or a plan whose references do not
// resolve.
absl::StatusOr<StepResult> SimulateStep(const v1::Plan& plan, const ClusterSpec& cluster, Schedule schedule,
                                        int64_t muon_batch_mib = planner::kDefaultMuonBatchMib);

}  // namespace muonshard::sim

#endif  // MUONSHARD_SIM_SIMULATE_STEP_H_
