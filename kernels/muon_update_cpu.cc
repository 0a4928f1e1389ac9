// CPU Muon update: for each matrix, momentum into a per-thread buffer,
// Newton–Schulz (OpenBLAS) on it, then decoupled decay and the master/bf16
// write. MuonUpdateCpu and MuonUpdateBatchCpu share one loop over matrices
// (internal::ForEachMatrixCpu), so a matrix's result does not depend on
// which call, item or thread handled it.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "kernels/bf16.h"
#include "kernels/internal/cpu_newton_schulz.h"
#include "kernels/internal/elementwise_math.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace {

void MomentumStep(const float* grad, float* momentum, float* update, int64_t n, float beta, bool nesterov) {
  for (int64_t i = 0; i < n; ++i) {
    update[i] = internal::MomentumElement(grad[i], momentum[i], beta, nesterov);
  }
}

void ApplyUpdate(const float* ortho, int64_t n, float decay, float step, float* master, Bf16Bits* model) {
  for (int64_t i = 0; i < n; ++i) {
    const float p = internal::MuonApplyElement(master[i], ortho[i], decay, step);
    master[i] = p;
    if (model != nullptr) model[i] = FloatToBf16(p);
  }
}

// The Muon step on every matrix of every item. REQUIRES: the arguments are
// valid (ValidateMuonArgs for each item).
absl::Status RunMuonCpu(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape, WeightLayout layout,
                        const MuonOptions& options) {
  MUONSHARD_ASSIGN_OR_RETURN(internal::CpuNsConfig config, internal::MakeCpuNsConfig(options.ns));
  const int64_t per_matrix = shape.matrix_elements();
  const MuonApplyScalars apply = MuonApplyScalarsFor(shape.rows, shape.cols, layout, options);
  const int64_t matrices = static_cast<int64_t>(items.size()) * shape.batch;
  internal::ForEachMatrixCpu(matrices, shape.rows, shape.cols, config, [&](int64_t j, internal::CpuNsScratch& scratch) {
    const MuonTensors& t = items[static_cast<size_t>(j / shape.batch)];
    const int64_t offset = (j % shape.batch) * per_matrix;
    scratch.input.resize(per_matrix);
    float* update = scratch.input.data();
    MomentumStep(t.grad + offset, t.momentum + offset, update, per_matrix, options.beta, options.nesterov);
    internal::OrthogonalizeMatrixCpu(update, shape.rows, shape.cols, config, scratch);
    ApplyUpdate(update, per_matrix, apply.decay, apply.step, t.master + offset,
                t.model != nullptr ? t.model + offset : nullptr);
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status MuonUpdateCpu(const MuonTensors& tensors, const MatrixBatchShape& shape, WeightLayout layout,
                           const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonArgs(tensors, shape, options));
  return RunMuonCpu(absl::MakeConstSpan(&tensors, 1), shape, layout, options);
}

absl::Status MuonUpdateBatchCpu(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape, WeightLayout layout,
                                const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonBatchArgs(items, shape, options));
  if (items.empty()) return absl::OkStatus();
  return RunMuonCpu(items, shape, layout, options);
}

absl::Status MuonMomentumCpu(const float* grad, float* momentum, float* update, int64_t n, const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonMomentumArgs(grad, momentum, update, n, options));
  MomentumStep(grad, momentum, update, n, options.beta, options.nesterov);
  return absl::OkStatus();
}

absl::Status MuonApplyCpu(const float* ortho, float* master, Bf16Bits* model, int64_t n,
                          const MuonApplyScalars& scalars) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonApplyArgs(ortho, master, n));
  ApplyUpdate(ortho, n, scalars.decay, scalars.step, master, model);
  return absl::OkStatus();
}

}  // namespace muonshard::kernels
