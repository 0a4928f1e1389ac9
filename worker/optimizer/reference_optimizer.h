#ifndef MUONSHARD_WORKER_OPTIMIZER_REFERENCE_OPTIMIZER_H_
#define MUONSHARD_WORKER_OPTIMIZER_REFERENCE_OPTIMIZER_H_

// ReferenceOptimizer: the unsharded Muon + AdamW step over whole tensors in
// one process — what every rank's ShardedOptimizer must reproduce. It uses
// the same kernels, hyper-parameters (OptimizerConfig), bf16/fp16 model-copy
// rounding and beta-power bookkeeping, and takes the mean gradient itself:
// for each tensor part, the local gradients of the ranks of the part's group
// are rounded to the plan's gradient dtype, widened to fp32, added in group
// rank order, divided by the group size and rounded again — exactly what an
// InProcess communicator's kAvg does. So with InProcess communicators the
// sharded result is bit-identical to this one.
//
// It needs the whole plan only to know which ranks contribute to each tensor
// part (the data-parallel groups); it holds every tensor whole, so it is for
// tests, `--reference` runs and small models.
//
// A tensor with ns_blocks is orthogonalised block by block
// (kernels::BlockedMuonUpdate, in the whole tensor's coordinates), as the
// sharded step does in every placement.
//
// Thread-compatible. *backend must outlive the optimizer.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/blocked_newton_schulz.h"
#include "kernels/kernel_backend.h"
#include "muonshard/v1/plan.pb.h"
#include "worker/optimizer/gradient_source.h"
#include "worker/optimizer/internal/typed_buffer.h"
#include "worker/optimizer/optimizer_config.h"

namespace muonshard::worker {

class ReferenceOptimizer {
 public:
  // Validates `plan` (planner::ValidatePlan) and `config`; keeps a copy of
  // the plan's tensors and groups.
  // Possible errors: INVALID_ARGUMENT, FAILED_PRECONDITION (non-CPU backend).
  static absl::StatusOr<std::unique_ptr<ReferenceOptimizer>> Create(const v1::Plan& plan,
                                                                    kernels::KernelBackend* backend,
                                                                    const OptimizerConfig& config);

  ReferenceOptimizer(const ReferenceOptimizer&) = delete;
  ReferenceOptimizer& operator=(const ReferenceOptimizer&) = delete;

  int world_size() const { return static_cast<int>(held_.size()); }
  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  const v1::PlannedTensor& tensor(int index) const { return plan_.tensors(index); }

  // The tensor parts rank `rank` holds: the same list its ShardedOptimizer's
  // held_tensors() returns. REQUIRES: 0 <= rank < world_size().
  const std::vector<HeldTensor>& HeldTensorsOf(int rank) const { return held_[rank]; }

  // Sets the whole tensor (numel values); see ShardedOptimizer::SetParameter.
  // Possible errors: NOT_FOUND (index), INVALID_ARGUMENT (size).
  absl::Status SetParameter(int tensor, absl::Span<const float> values);

  // One step. per_rank[r] supplies rank r's local gradients of the parts in
  // HeldTensorsOf(r) (the GradientSource its ShardedOptimizer would get).
  // Possible errors: INVALID_ARGUMENT (per_rank size, gradient sizes, null
  // source), the sources' errors (nothing changed), kernel errors.
  absl::Status Step(absl::Span<GradientSource* const> per_rank);

  // Model copy values of elements [begin, begin + out.size()) of `tensor`.
  // Possible errors: NOT_FOUND, OUT_OF_RANGE.
  absl::Status ReadModelCopy(int tensor, int64_t begin, absl::Span<float> out) const;
  // The fp32 master of the whole tensor. REQUIRES: a valid index.
  const std::vector<float>& master(int tensor) const { return tensors_[tensor].master; }

  // Bytes of optimizer state (masters, momenta, moments) for every tensor.
  int64_t optimizer_state_bytes() const;
  int64_t steps_done() const { return steps_; }
  // See ShardedOptimizer::SetLearningRate.
  absl::Status SetLearningRate(float lr);

 private:
  struct TensorState {
    internal::TypedBuffer model;
    std::vector<float> master;
    std::vector<float> momentum;  // Muon
    std::vector<float> moment1;   // AdamW
    std::vector<float> moment2;
    bool with_decay = true;
  };

  ReferenceOptimizer(const v1::Plan& plan, kernels::KernelBackend* backend, const OptimizerConfig& config);
  absl::Status Init();
  // The mean gradient of `tensor` over its parts' groups (see the header).
  absl::Status MeanGradient(int tensor, absl::Span<GradientSource* const> per_rank, std::vector<float>& mean) const;
  absl::Status Update(int tensor, const std::vector<float>& grad);

  v1::Plan plan_;                          // tensors and groups only
  kernels::KernelBackend* const backend_;  // not owned
  OptimizerConfig config_;
  v1::DType grad_dtype_ = v1::FP32;
  std::vector<TensorState> tensors_;
  std::vector<std::vector<HeldTensor>> held_;  // per rank
  // Per-block Newton-Schulz of the tensors with ns_blocks, by plan index.
  absl::flat_hash_map<int, kernels::NsBlockSpec> blocks_;
  float beta1_pow_ = 0;  // NOTE [Beta powers] in sharded_optimizer.h
  float beta2_pow_ = 0;
  int64_t steps_ = 0;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_OPTIMIZER_REFERENCE_OPTIMIZER_H_
