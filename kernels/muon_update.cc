// Backend-independent parts of the Muon update: scale and validation.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {

double MuonUpdateScale(int64_t rows, int64_t cols, WeightLayout layout,
                       MuonScaleVersion version, float extra_scale) {
  const bool out_in = layout == WeightLayout::kOutIn;
  const double dout = static_cast<double>(out_in ? rows : cols);
  const double din = static_cast<double>(out_in ? cols : rows);
  double scale = 0;
  switch (version) {
    case MuonScaleVersion::kV1:
      scale = std::sqrt(std::max(1.0, dout / din));
      break;
    case MuonScaleVersion::kV2:
      scale = std::sqrt(dout / din);
      break;
    case MuonScaleVersion::kV3:
      scale = std::sqrt(std::max(dout, din));
      break;
  }
  return scale * extra_scale;
}

absl::Status ValidateMuonArgs(const MuonTensors& tensors,
                              const MatrixBatchShape& shape,
                              const MuonOptions& options) {
  if (tensors.grad == nullptr || tensors.momentum == nullptr ||
      tensors.master == nullptr) {
    return absl::InvalidArgumentError(
        "Muon update: grad, momentum and master must not be null");
  }
  MUONSHARD_RETURN_IF_ERROR(ValidateMatrixBatchShape(shape));
  if (!(options.beta >= 0.0f && options.beta <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Muon beta must be in [0, 1], got ", options.beta));
  }
  if (!std::isfinite(options.lr) || !std::isfinite(options.weight_decay) ||
      !std::isfinite(options.extra_scale)) {
    return absl::InvalidArgumentError(
        "Muon lr, weight_decay and extra_scale must be finite");
  }
  switch (options.scale_version) {
    case MuonScaleVersion::kV1:
    case MuonScaleVersion::kV2:
    case MuonScaleVersion::kV3:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown Muon scale version ",
                       static_cast<int>(options.scale_version)));
  }
  return ResolveNsCoefficients(options.ns).status();
}

}  // namespace muonshard::kernels
