#ifndef MUONSHARD_WORKER_OPTIMIZER_GRADIENT_SOURCE_H_
#define MUONSHARD_WORKER_OPTIMIZER_GRADIENT_SOURCE_H_

// How a training program hands its local gradients to an optimizer step, and
// how it learns which tensor parts a rank holds.
//
// A rank holds a *part* of a tensor: the whole tensor, or, for a fused expert
// stack under expert parallelism, the contiguous element range of its
// expert-parallel rank (v1::TensorPart). Gradients and parameter values are
// always exchanged for the rank's whole part, as fp32, row-major in the
// tensor's flattened element space from element_begin to element_end.

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/kernel_backend.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::worker {

// One tensor part a rank holds. `spec` points into the optimizer that
// returned it and lives as long as that optimizer.
struct HeldTensor {
  int tensor = 0;  // index into Plan.tensors
  const v1::PlannedTensor* spec = nullptr;
  int group = 0;  // CommGroup id of the part
  int64_t element_begin = 0;
  int64_t element_end = 0;
  // A TP-split tensor (tp > 1; NOTE [Tensor-parallel Muon] in
  // sharded_optimizer.h): the elements are of this rank's shard, the
  // tp_rank-th of tp blocks along the split dimension (spec->local_shape);
  // tp is 1 otherwise.
  int tp = 1;
  int tp_rank = 0;
  // The tp group as a mesh (planner::TpMeshOf); a tile's place there is
  // planner::TpTileOf (NOTE [TP mesh tiles] in plan/tp_mesh.h).
  std::vector<int> tp_mesh;

  int64_t numel() const { return element_end - element_begin; }
};

// The local (not yet averaged) fp32 gradients of one step, one rank.
// Thread-compatible; an optimizer calls it from its caller's thread only.
class GradientSource {
 public:
  virtual ~GradientSource() = default;

  // The gradient of the part of plan tensor `tensor` this rank holds
  // (HeldTensor::numel() values). The span must stay valid until the step
  // that asked for it returns.
  // Possible errors: NOT_FOUND (no gradient for the tensor); any other code
  // is passed through by the step.
  virtual absl::StatusOr<absl::Span<const float>> PartGradient(int tensor) = 0;
};

// A GradientSource over gradients held in memory, keyed by plan tensor index.
class GradientMap : public GradientSource {
 public:
  // Adds or replaces the gradient of `tensor`.
  void Set(int tensor, std::vector<float> gradient) { grads_[tensor] = std::move(gradient); }
  // The gradient of `tensor`, created empty if absent (to fill in place).
  std::vector<float>& Mutable(int tensor) { return grads_[tensor]; }
  size_t size() const { return grads_.size(); }

  absl::StatusOr<absl::Span<const float>> PartGradient(int tensor) override;

 private:
  std::map<int, std::vector<float>> grads_;
};

// A part's local gradient already in the kernel backend's memory: a CUDA
// tensor's device pointer for the CUDA backend, host memory for the CPU one.
// The step converts it straight into its gradient bucket in that memory (no
// host round trip); a gradient that already *is* its bucket slot (NOTE [Part
// storage] in sharded_optimizer.h) is not copied at all.
struct BackendGradient {
  const void* data = nullptr;
  kernels::ElementType type = kernels::ElementType::kFloat32;
  int64_t numel = 0;
};

// The local gradients of one step in backend memory. The memory must hold
// its values when Step() is called (work that writes it, e.g. a backward
// pass on another stream, finished or ordered before the backend's stream)
// and must not change until the step returns.
class BackendGradientSource {
 public:
  virtual ~BackendGradientSource() = default;

  // The gradient of the part of plan tensor `tensor` this rank holds.
  // Possible errors: NOT_FOUND (no gradient for the tensor); any other code
  // is passed through by the step.
  virtual absl::StatusOr<BackendGradient> PartGradient(int tensor) = 0;
};

// A BackendGradientSource over gradients registered by plan tensor index.
class BackendGradientMap : public BackendGradientSource {
 public:
  void Set(int tensor, BackendGradient gradient) { grads_[tensor] = gradient; }
  size_t size() const { return grads_.size(); }

  absl::StatusOr<BackendGradient> PartGradient(int tensor) override;

 private:
  std::map<int, BackendGradient> grads_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_OPTIMIZER_GRADIENT_SOURCE_H_
