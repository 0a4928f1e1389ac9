// Backend-independent parts of AdamW: validation and beta-power bookkeeping.

#include "kernels/adamw.h"

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/internal/adamw_scalars.h"
#include "kernels/internal/elementwise_math.h"

namespace muonshard::kernels {
namespace {

bool InUnitInterval(float x) { return x >= 0.0f && x < 1.0f; }

}  // namespace

absl::Status ValidateAdamWArgs(const AdamWTensors& tensors, int64_t n, const AdamWBetaPows& pows,
                               const AdamWOptions& options) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW element count must be >= 0, got ", n));
  }
  if (n > 0 && (tensors.grad == nullptr || tensors.master == nullptr || tensors.moment1 == nullptr ||
                tensors.moment2 == nullptr)) {
    return absl::InvalidArgumentError("AdamW: grad, master, moment1 and moment2 must not be null");
  }
  if (pows.beta1_pow == nullptr || pows.beta2_pow == nullptr) {
    return absl::InvalidArgumentError("AdamW: beta powers must not be null");
  }
  if (!InUnitInterval(options.beta1) || !InUnitInterval(options.beta2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW betas must be in [0, 1), got ", options.beta1, ", ", options.beta2));
  }
  // A power of 1 (Paddle's OLD initialisation) would divide by zero here.
  if (!InUnitInterval(*pows.beta1_pow) || !InUnitInterval(*pows.beta2_pow)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AdamW beta powers must be in [0, 1) (they start at the betas), got ", *pows.beta1_pow, ", ", *pows.beta2_pow));
  }
  if (!std::isfinite(options.lr) || !std::isfinite(options.weight_decay) || !(options.eps >= 0.0f) ||
      !std::isfinite(options.eps)) {
    return absl::InvalidArgumentError("AdamW lr and weight_decay must be finite and eps finite and >= 0");
  }
  return absl::OkStatus();
}

namespace internal {

AdamWScalars MakeAdamWScalars(const AdamWOptions& options, float beta1_pow, float beta2_pow) {
  return AdamWScalars{
      options.with_decay ? 1.0f - options.lr * options.weight_decay : 1.0f,
      options.beta1,
      options.beta2,
      -(options.lr / (1.0f - beta1_pow)),
      std::sqrt(1.0f - beta2_pow),
      options.eps,
  };
}

}  // namespace internal

void AdvanceBetaPows(const AdamWBetaPows& pows, const AdamWOptions& options) {
  if (!options.advance_beta_pows) return;
  *pows.beta1_pow *= options.beta1;
  *pows.beta2_pow *= options.beta2;
}

}  // namespace muonshard::kernels
