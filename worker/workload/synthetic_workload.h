#ifndef MUONSHARD_WORKER_WORKLOAD_SYNTHETIC_WORKLOAD_H_
#define MUONSHARD_WORKER_WORKLOAD_SYNTHETIC_WORKLOAD_H_

// SyntheticWorkload: deterministic pseudo-random gradients for any manifest,
// for benchmarks on real model shapes and for equivalence tests. Element i of
// tensor T on rank r at step s is
//   grad_scale * U(key(seed, hash(T.name), s, r), i),  U uniform in [-1, 1),
// from a counter-based generator (internal/counter_rng.h): no global state,
// independent of how the tensor is split. The gradients ignore the
// parameters, so there is no loss (0). Initial values are
// init_scale * U(key(seed, hash(T.name), "init"), i).

#include <cstdint>

#include "worker/workload/workload.h"

namespace muonshard::worker {

struct SyntheticWorkloadOptions {
  uint64_t seed = 1;
  float grad_scale = 1.0f;
  float init_scale = 0.02f;
};

class SyntheticWorkload : public Workload {
 public:
  explicit SyntheticWorkload(const SyntheticWorkloadOptions& options = {}) : options_(options) {}

  absl::string_view name() const override { return "synthetic"; }
  bool uses_parameters() const override { return false; }
  absl::Status InitialValues(const v1::PlannedTensor& tensor, int64_t element_begin,
                             absl::Span<float> out) const override;
  absl::StatusOr<double> Gradient(const v1::PlannedTensor& tensor, int64_t element_begin,
                                  absl::Span<const float> params, int64_t step, int rank,
                                  absl::Span<float> grad) const override;

 private:
  const SyntheticWorkloadOptions options_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_WORKLOAD_SYNTHETIC_WORKLOAD_H_
