#ifndef MUONSHARD_KERNELS_ADAMW_H_
#define MUONSHARD_KERNELS_ADAMW_H_

// AdamW for the non-Muon (1-D / element-sharded) parameters, with the
// semantics of Paddle's fused `adamw_` kernel (docs/reference/paddle_internals.md §3.6):
//
//   p  = p · (1 - lr·wd)                        (only if with_decay)
//   m1 = β1·m1 + (1-β1)·g
//   m2 = β2·m2 + (1-β2)·g²
//   p  = p - lr/(1-β1^t) · m1 / (sqrt(m2)/sqrt(1-β2^t) + eps)
//   model = bf16(p)                             (if a bf16 copy is given)
//   β1^t ·= β1;  β2^t ·= β2                     (after use)
//
// β1^t and β2^t are the parameter's beta-power accumulators: Paddle keeps one
// pair per parameter, initialised to β1 and β2 (so the first step divides by
// 1-β1, not by 1 - 1). The caller owns them and passes them per call; a
// parameter split into several slices must pass the same pair for each slice
// and advance it once (advance_beta_pows only on the last slice).
// Paddle's lr_ratio folds into `lr`.

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/bf16.h"

namespace muonshard::kernels {

struct AdamWOptions {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-9f;
  float weight_decay = 0.01f;
  bool with_decay = true;
  // Multiply the beta powers after the update (Paddle does, every step).
  bool advance_beta_pows = true;
};

// The beta-power accumulators of one parameter. Always HOST pointers, for
// every backend: the CUDA backend passes their values to its kernel by value
// and advances them on the host, so no device round trip is needed.
struct AdamWBetaPows {
  float* beta1_pow = nullptr;  // In/out; starts at beta1.
  float* beta2_pow = nullptr;  // In/out; starts at beta2.
};

// Element buffers of one slice, each `n` long. Host memory for the CPU
// backend, device memory for the CUDA backend; they must not overlap.
struct AdamWTensors {
  const float* grad = nullptr;
  float* master = nullptr;    // In/out, fp32 master weight.
  float* moment1 = nullptr;   // In/out.
  float* moment2 = nullptr;   // In/out.
  Bf16Bits* model = nullptr;  // Optional out: bf16(master).
};

// Validates everything but the tensors' memory space (n >= 0, non-null
// pointers when n > 0, beta powers in [0, 1), finite hyper-parameters).
// Possible errors: INVALID_ARGUMENT.
absl::Status ValidateAdamWArgs(const AdamWTensors& tensors, int64_t n, const AdamWBetaPows& pows,
                               const AdamWOptions& options);

// Advances the beta powers if options.advance_beta_pows.
void AdvanceBetaPows(const AdamWBetaPows& pows, const AdamWOptions& options);

// CPU implementation: host pointers; blocks until done.
// Possible errors: INVALID_ARGUMENT.
absl::Status AdamWCpu(const AdamWTensors& tensors, int64_t n, const AdamWBetaPows& pows, const AdamWOptions& options);

}  // namespace muonshard::kernels

#endif  // MUONSHARD_KERNELS_ADAMW_H_
