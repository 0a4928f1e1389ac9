#include "sim/simulate_step.h"

#include <utility>

#include "common/status_macros.h"

namespace muonshard::sim {

absl::StatusOr<StepResult> SimulateStep(const v1::Plan& plan, const ClusterSpec& cluster, Schedule schedule,
                                        int64_t muon_batch_mib) {
  MUONSHARD_RETURN_IF_ERROR(ValidateCluster(cluster));
  const int world = plan.topology().world_size() > 0 ? plan.topology().world_size() : plan.ranks_size();
  MUONSHARD_RETURN_IF_ERROR(CheckWorldFits(cluster, world));
  MUONSHARD_ASSIGN_OR_RETURN(StepProgram program, BuildPlanProgram(plan, schedule, NsCalls::kWorker, muon_batch_mib));
  return RunStepProgram(std::move(program), cluster);
}

}  // namespace muonshard::sim
