#ifndef MUONSHARD_KERNELS_INTERNAL_ELEMENTWISE_MATH_H_
#define MUONSHARD_KERNELS_INTERNAL_ELEMENTWISE_MATH_H_

// Per-element optimizer math shared by the CPU loops and the CUDA kernels, so
// both backends evaluate the same fp32 expressions in the same order. Kept
// free of abseil so nvcc compiles it into the CUDA kernels.

#include <cmath>

#include "kernels/bf16.h"

namespace muonshard::kernels::internal {

// Muon momentum: m = β·m + (1-β)·g; returns the update input
// (1-β)·g + β·m (Nesterov) or m.
MUONSHARD_HOST_DEVICE inline float MomentumElement(float g, float& m, float beta, bool nesterov) {
  const float one_minus_beta = 1.0f - beta;
  m = beta * m + one_minus_beta * g;
  return nesterov ? one_minus_beta * g + beta * m : m;
}

// Muon apply: p = p·decay - step·O.
MUONSHARD_HOST_DEVICE inline float MuonApplyElement(float p, float ortho, float decay, float step) {
  return p * decay - step * ortho;
}

// Step-invariant AdamW scalars, computed once per call on the host
// (MakeAdamWScalars in adamw_scalars.h).
struct AdamWScalars {
  float decay;  // 1 - lr·wd, or 1 without decay.
  float beta1;
  float beta2;
  float neg_lr_t;    // -(lr / (1 - β1^t)).
  float sqrt_bias2;  // sqrt(1 - β2^t).
  float eps;
};

// One AdamW element in the operation order of Paddle's adamw kernel.
MUONSHARD_HOST_DEVICE inline void AdamWElement(float g, float& p, float& m1, float& m2, const AdamWScalars& s) {
  p *= s.decay;
  m1 = s.beta1 * m1 + (1.0f - s.beta1) * g;
  m2 = s.beta2 * m2 + (1.0f - s.beta2) * g * g;
  const float denom = sqrtf(m2) / s.sqrt_bias2 + s.eps;
  p += (m1 / denom) * s.neg_lr_t;
}

}  // namespace muonshard::kernels::internal

#endif  // MUONSHARD_KERNELS_INTERNAL_ELEMENTWISE_MATH_H_
