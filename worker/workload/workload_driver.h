#ifndef MUONSHARD_WORKER_WORKLOAD_WORKLOAD_DRIVER_H_
#define MUONSHARD_WORKER_WORKLOAD_WORKLOAD_DRIVER_H_

// The training loop of a worker without a real model: a Workload computes
// each rank's local gradients from the rank's model copy and the optimizer
// steps. The same functions drive the unsharded ReferenceOptimizer (all ranks
// in one process), so a sharded run and its reference see the same data.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/optimizer/gradient_source.h"
#include "worker/optimizer/reference_optimizer.h"
#include "worker/optimizer/sharded_optimizer.h"
#include "worker/optimizer/step_stats.h"
#include "worker/workload/workload.h"

namespace muonshard::worker {

// Sets every tensor part the optimizer holds (every tensor, for the
// reference) to the workload's initial values.
absl::Status InitializeParameters(const Workload& workload, ShardedOptimizer& optimizer);
absl::Status InitializeParameters(const Workload& workload, ReferenceOptimizer& optimizer);

struct LocalGradients {
  GradientMap grads;  // by plan tensor index
  double loss = 0;    // the rank's loss over its parts
};

// NOTE [Workloads on TP shards]
// A tensor-parallel rank holds shard h.tp_rank of a split tensor (HeldTensor
// tp > 1). Its initial values and gradients are the whole tensor's (the
// workload sees the PlannedTensor, whole shape) cut to the shard
// (planner::TpShardRunsOf), and its data is that of its model replica,
// DataRank(): the TP ranks of one replica see one batch, as in Megatron,
// and the unsharded reference of the replica plan (tp 1, W / tp ranks)
// sees the same gradients (for replicated tensors too). Workloads that read the parameters cannot run there
// (FAILED_PRECONDITION): the rank does not hold the whole tensor.

// The data-parallel index a rank's workload data comes from: its model
// replica, rank / tp (the rank itself when tp = 1).
int DataRank(const ShardedOptimizer& optimizer);

// The workload's initial values of held part `h` (TP: of its shard).
absl::Status HeldInitialValues(const Workload& workload, const HeldTensor& h, absl::Span<float> out);

// Data rank `rank`'s gradient at `step` of TP shard `h` into `grad`.
absl::StatusOr<double> TpShardGradient(const Workload& workload, const HeldTensor& h, int rank, int64_t step,
                                       absl::Span<float> grad);

// Data rank `rank`'s gradients at `step` of the parts in `held`, from the
// model copy that `read(held_tensor, out)` fills.
template <typename ReadFn>
absl::StatusOr<LocalGradients> ComputeLocalGradients(const Workload& workload, const std::vector<HeldTensor>& held,
                                                     int rank, int64_t step, const ReadFn& read);

struct TrainStepResult {
  double loss = 0;  // this rank's loss before the step
  StepStats stats;
};

// One step on this rank: its gradients from its model copy, then Step().
// A collective over the rank's groups (as ShardedOptimizer::Step).
absl::StatusOr<TrainStepResult> TrainStep(const Workload& workload, ShardedOptimizer& optimizer, int64_t step);

// The same step for every rank with the reference; returns the losses by
// rank.
absl::StatusOr<std::vector<double>> TrainStep(const Workload& workload, ReferenceOptimizer& optimizer, int64_t step);

// --- implementation ---

template <typename ReadFn>
absl::StatusOr<LocalGradients> ComputeLocalGradients(const Workload& workload, const std::vector<HeldTensor>& held,
                                                     int rank, int64_t step, const ReadFn& read) {
  LocalGradients out;
  std::vector<float> params;
  for (const HeldTensor& h : held) {
    std::vector<float>& grad = out.grads.Mutable(h.tensor);
    grad.resize(h.numel());
    if (h.tp > 1) {
      absl::StatusOr<double> loss = TpShardGradient(workload, h, rank, step, absl::MakeSpan(grad));
      if (!loss.ok()) return loss.status();
      out.loss += *loss;
      continue;
    }
    params.resize(h.numel());
    absl::Status s = read(h, absl::MakeSpan(params));
    if (!s.ok()) return s;
    absl::StatusOr<double> loss = workload.Gradient(*h.spec, h.element_begin, params, step, rank, absl::MakeSpan(grad));
    if (!loss.ok()) return loss.status();
    out.loss += *loss;
  }
  return out;
}

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_WORKLOAD_WORKLOAD_DRIVER_H_
