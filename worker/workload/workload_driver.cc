#include "worker/workload/workload_driver.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/model.h"
#include "plan/tp_mesh.h"

namespace muonshard::worker {

namespace {

// The held part's elements of `whole` (the whole tensor's values).
void CutShard(const HeldTensor& h, absl::Span<const float> whole, absl::Span<float> out) {
  const planner::TpShardRuns runs =
      h.tp_mesh.size() > 1 ? planner::RunsOfTile(h.spec->shape(), planner::TpTileOf(*h.spec, h.tp_mesh, h.tp_rank))
                           : planner::TpShardRunsOf(*h.spec, h.tp, h.tp_rank);
  for (int64_t i = 0; i < h.numel(); ++i) out[i] = whole[runs.WholeIndex(h.element_begin + i)];
}

}  // namespace

int DataRank(const ShardedOptimizer& optimizer) {
  return optimizer.rank() / std::max(1, optimizer.view().topology().tp());
}

absl::Status HeldInitialValues(const Workload& workload, const HeldTensor& h, absl::Span<float> out) {
  if (h.tp <= 1) return workload.InitialValues(*h.spec, h.element_begin, out);
  std::vector<float> whole(h.spec->numel());
  MUONSHARD_RETURN_IF_ERROR(workload.InitialValues(*h.spec, 0, absl::MakeSpan(whole)));
  CutShard(h, whole, out);
  return absl::OkStatus();
}

absl::StatusOr<double> TpShardGradient(const Workload& workload, const HeldTensor& h, int rank, int64_t step,
                                       absl::Span<float> grad) {
  if (workload.uses_parameters()) {
    return absl::FailedPreconditionError(absl::StrCat("the ", workload.name(),
                                                      " workload computes gradients from the whole parameters, which a "
                                                      "tensor-parallel rank does not hold (tensor \"",
                                                      h.spec->name(), "\"); use synthetic"));
  }
  // The parameters are not read (above): zeros of the right size.
  const std::vector<float> params(h.spec->numel(), 0.0f);
  std::vector<float> whole(h.spec->numel());
  MUONSHARD_ASSIGN_OR_RETURN(const double loss,
                             workload.Gradient(*h.spec, 0, params, step, rank, absl::MakeSpan(whole)));
  CutShard(h, whole, grad);
  return loss;
}

absl::Status InitializeParameters(const Workload& workload, ShardedOptimizer& optimizer) {
  std::vector<float> values;
  for (const HeldTensor& h : optimizer.held_tensors()) {
    values.resize(h.numel());
    MUONSHARD_RETURN_IF_ERROR(HeldInitialValues(workload, h, absl::MakeSpan(values)));
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
  MUONSHARD_ASSIGN_OR_RETURN(LocalGradients local,
                             ComputeLocalGradients(workload, optimizer.held_tensors(), DataRank(optimizer), step,
                                                   [&](const HeldTensor& h, absl::Span<float> out) {
                                                     return optimizer.ReadModelCopy(h.tensor, out);
                                                   }));
  TrainStepResult result;
  result.loss = local.loss;
  MUONSHARD_ASSIGN_OR_RETURN(result.stats, optimizer.Step(local.grads));
  return result;
}

absl::StatusOr<std::vector<double>> TrainStep(const Workload& workload, ReferenceOptimizer& optimizer, int64_t step) {
  std::vector<LocalGradients> locals;
  std::vector<double> losses;
  for (int r = 0; r < optimizer.world_size(); ++r) {
    MUONSHARD_ASSIGN_OR_RETURN(LocalGradients local,
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
