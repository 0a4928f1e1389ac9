#ifndef MUONSHARD_WORKER_WORKLOAD_REGRESSION_WORKLOAD_H_
#define MUONSHARD_WORKER_WORKLOAD_REGRESSION_WORKLOAD_H_

// RegressionWorkload: a small real model made of the manifest's own tensors,
// trained data-parallel on synthetic teacher data with analytic gradients,
// so the loss falls as the optimizer works.
//
// Every matrix W (rows x cols: a 2-D tensor — linear layers and the
// embedding alike — or one expert of a 3-D stack; tensors of more
// dimensions are batches of their last two) fits a teacher W* on inputs x:
//   loss = ½‖(W − W*) X‖² / B,   grad = (W − W*) X Xᵀ / B,
// where X holds B input columns of length cols. Every 1-D tensor w (norms,
// biases) fits an elementwise target t with per-element data weights a:
//   loss = ½ Σ_b Σ_i (a_bi (w_i − t_i))² / B,   grad_i = (w_i − t_i) Σ_b a_bi² / B.
// W* and t depend on (seed, tensor name, matrix/element index) only; X and a
// also on (step, rank), so each rank sees different data (data parallelism)
// and the mean gradient over a group is a larger batch. The forward pass uses
// the given parameters: the rank's model copy.
//
// Values come from the counter-based generator (internal/counter_rng.h),
// uniform in [-1, 1) times the scales below; sums run in double in a fixed
// order. Initial parameters are init_scale * U(...), per element.

#include <cstdint>

#include "worker/workload/workload.h"

namespace muonshard::worker {

struct RegressionWorkloadOptions {
  uint64_t seed = 1;
  int batch = 8;  // B: input columns per rank and step
  float init_scale = 0.02f;
  float teacher_scale = 0.05f;
};

class RegressionWorkload : public Workload {
 public:
  explicit RegressionWorkload(const RegressionWorkloadOptions& options = {}) : options_(options) {}

  absl::string_view name() const override { return "regression"; }
  bool uses_parameters() const override { return true; }
  absl::Status InitialValues(const v1::PlannedTensor& tensor, int64_t element_begin,
                             absl::Span<float> out) const override;
  // INVALID_ARGUMENT also for a part of a 2-D+ tensor that is not whole
  // matrices, or a batch < 1.
  absl::StatusOr<double> Gradient(const v1::PlannedTensor& tensor, int64_t element_begin,
                                  absl::Span<const float> params, int64_t step, int rank,
                                  absl::Span<float> grad) const override;

 private:
  // One matrix (global index `matrix`) of rows x cols.
  double MatrixGradient(const v1::PlannedTensor& tensor, int64_t matrix, int64_t rows, int64_t cols,
                        const float* params, int64_t step, int rank, float* grad) const;
  double VectorGradient(const v1::PlannedTensor& tensor, int64_t element_begin, absl::Span<const float> params,
                        int64_t step, int rank, absl::Span<float> grad) const;

  const RegressionWorkloadOptions options_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_WORKLOAD_REGRESSION_WORKLOAD_H_
