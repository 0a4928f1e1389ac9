#include "worker/workload/workload_driver.h"

#include "common/status_macros.h"

namespace muonshard::worker {

absl::Status InitializeParameters(const Workload& workload, ShardedOptimizer& optimizer) {
  std::vector<float> values;
  for (const HeldTensor& h : optimizer.held_tensors()) {
    values.resize(h.numel());
    MUONSHARD_RETURN_IF_ERROR(workload.InitialValues(*h.spec, h.element_begin, absl::MakeSpan(values)));
    MUONSHARD_RETURN_IF_ERROR(optimizer.SetParameter(h.tensor, values));
  }
  return absl::OkStatus();
}

absl::Status InitializeParameters(const Workload& workload, ReferenceOptimizer& optimizer) {
  std::vector<float> values;
  for (int i = 0; i < optimizer.num_tensors(); ++i) {
    values.resize(optimizer.tensor(i).numel());
    MUONSHARD_RETURN_IF_ERROR(workload.InitialValues(optimizer.tensor(i), 0, absl::MakeSpan(values)));
    MUONSHARD_RETURN_IF_ERROR(optimizer.SetParameter(i, values));
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainStepResult> TrainStep(const Workload& workload, ShardedOptimizer& optimizer, int64_t step) {
  MUONSHARD_ASSIGN_OR_RETURN(
      LocalGradients local,
      ComputeLocalGradients(workload, optimizer.held_tensors(), optimizer.rank(), step,
                            [&](const HeldTensor& h, absl::Span<float> out) {
                              return optimizer.ReadModelCopy(h.tensor, out);
                            }));
  TrainStepResult result;
  result.loss = local.loss;
  MUONSHARD_ASSIGN_OR_RETURN(result.stats, optimizer.Step(local.grads));
  return result;
}

absl::StatusOr<std::vector<double>> TrainStep(const Workload& workload, ReferenceOptimizer& optimizer,
                                              int64_t step) {
  std::vector<LocalGradients> locals;
  std::vector<double> losses;
  for (int r = 0; r < optimizer.world_size(); ++r) {
    MUONSHARD_ASSIGN_OR_RETURN(
        LocalGradients local,
        ComputeLocalGradients(workload, optimizer.HeldTensorsOf(r), r, step,
                              [&](const HeldTensor& h, absl::Span<float> out) {
                                return optimizer.ReadModelCopy(h.tensor, h.element_begin, out);
                              }));
    losses.push_back(local.loss);
    locals.push_back(std::move(local));
  }
  std::vector<GradientSource*> sources;
  for (LocalGradients& l : locals) sources.push_back(&l.grads);
  MUONSHARD_RETURN_IF_ERROR(optimizer.Step(sources));
  return losses;
}

}  // namespace muonshard::worker
