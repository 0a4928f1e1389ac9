// CPU Muon update: momentum, Newton–Schulz (OpenBLAS), decoupled decay and
// the master/bf16 write, in three passes over the buffers.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/bf16.h"
#include "kernels/internal/cpu_newton_schulz.h"
#include "kernels/internal/elementwise_math.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {
namespace {

void MomentumStep(const float* grad, float* momentum, float* update, int64_t n,
                  float beta, bool nesterov) {
  for (int64_t i = 0; i < n; ++i) {
    update[i] = internal::MomentumElement(grad[i], momentum[i], beta, nesterov);
  }
}

void ApplyUpdate(const float* ortho, int64_t n, float decay, float step,
                 float* master, Bf16Bits* model) {
  for (int64_t i = 0; i < n; ++i) {
    const float p = internal::MuonApplyElement(master[i], ortho[i], decay, step);
    master[i] = p;
    if (model != nullptr) model[i] = FloatToBf16(p);
  }
}

}  // namespace

absl::Status MuonUpdateCpu(const MuonTensors& tensors,
                           const MatrixBatchShape& shape, WeightLayout layout,
                           const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonArgs(tensors, shape, options));
  MUONSHARD_ASSIGN_OR_RETURN(internal::CpuNsConfig config,
                             internal::MakeCpuNsConfig(options.ns));
  const int64_t n = shape.elements();
  std::vector<float> update(n);
  MomentumStep(tensors.grad, tensors.momentum, update.data(), n, options.beta,
               options.nesterov);
  internal::OrthogonalizeBatchCpu(update.data(), shape, config);
  const double scale = MuonUpdateScale(shape.rows, shape.cols, layout,
                                       options.scale_version,
                                       options.extra_scale);
  const float decay =
      options.with_decay ? 1.0f - options.lr * options.weight_decay : 1.0f;
  ApplyUpdate(update.data(), n, decay, static_cast<float>(options.lr * scale),
              tensors.master, tensors.model);
  return absl::OkStatus();
}

}  // namespace muonshard::kernels
