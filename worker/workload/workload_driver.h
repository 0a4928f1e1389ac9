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

// Rank `rank`'s gradients at `step` of the parts in `held`, from the model
// copy that `read(held_tensor, out)` fills.
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
absl::StatusOr<std::vector<double>> TrainStep(const Workload& workload, ReferenceOptimizer& optimizer,
                                              int64_t step);

// --- implementation ---

template <typename ReadFn>
absl::StatusOr<LocalGradients> ComputeLocalGradients(const Workload& workload, const std::vector<HeldTensor>& held,
                                                     int rank, int64_t step, const ReadFn& read) {
  LocalGradients out;
  std::vector<float> params;
  for (const HeldTensor& h : held) {
    params.resize(h.numel());
    absl::Status s = read(h, absl::MakeSpan(params));
    if (!s.ok()) return s;
    std::vector<float>& grad = out.grads.Mutable(h.tensor);
    grad.resize(h.numel());
    absl::StatusOr<double> loss =
        workload.Gradient(*h.spec, h.element_begin, params, step, rank, absl::MakeSpan(grad));
    if (!loss.ok()) return loss.status();
    out.loss += *loss;
  }
  return out;
}

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_WORKLOAD_WORKLOAD_DRIVER_H_
