#ifndef MUONSHARD_WORKER_WORKLOAD_WORKLOAD_H_
#define MUONSHARD_WORKER_WORKLOAD_WORKLOAD_H_

// Workload: what stands in for a model's forward and backward pass when a
// worker trains without a real model — the local gradients of one rank at
// one step, and the initial parameters. Implementations are pure functions of
// (their seed and options, tensor name, shape, element range, step, rank,
// parameter values), so any process (a sharded rank, the reference, a rerun)
// computes the same numbers, and the sharded and reference runs can be
// compared bit for bit.
//
//   SyntheticWorkload  (synthetic_workload.h)   pseudo-random gradients for
//                                               any manifest (benchmarks).
//   RegressionWorkload (regression_workload.h)  a small real regression
//                                               model whose loss falls.
//
// A call covers one tensor part: elements [element_begin, element_begin + n)
// of the tensor's flattened, row-major element space. Parts are whole
// tensors or whole-matrix ranges of an expert stack.
//
// Thread-safe: every method is const and keeps no state.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::worker {

class Workload {
 public:
  virtual ~Workload() = default;

  virtual absl::string_view name() const = 0;

  // Whether Gradient reads `params`. A rank holding a tensor-parallel shard
  // has only its shard of the parameters, so it can run only workloads that
  // do not (the driver computes the whole tensor's gradient and keeps the
  // shard: see workload_driver.h).
  virtual bool uses_parameters() const = 0;

  // Initial values of elements [element_begin, element_begin + out.size()).
  // Possible errors: INVALID_ARGUMENT (range outside the tensor).
  virtual absl::Status InitialValues(const v1::PlannedTensor& tensor, int64_t element_begin,
                                     absl::Span<float> out) const = 0;

  // The local gradient of `rank` at `step` of the part starting at
  // `element_begin` whose current model-copy values are `params`, written to
  // `grad` (same size). Returns the part's loss on this rank's data (0 for a
  // workload without a loss).
  // Possible errors: INVALID_ARGUMENT (sizes, a range that is not whole
  // matrices where the workload needs them).
  virtual absl::StatusOr<double> Gradient(const v1::PlannedTensor& tensor, int64_t element_begin,
                                          absl::Span<const float> params, int64_t step, int rank,
                                          absl::Span<float> grad) const = 0;
};

// INVALID_ARGUMENT unless [element_begin, element_begin + n) lies in the
// tensor.
absl::Status CheckPartRange(const v1::PlannedTensor& tensor, int64_t element_begin, int64_t n);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_WORKLOAD_WORKLOAD_H_
