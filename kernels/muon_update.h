#ifndef MUONSHARD_KERNELS_MUON_UPDATE_H_
#define MUONSHARD_KERNELS_MUON_UPDATE_H_

// The Muon step for one 2-D parameter or one 3-D expert stack (many
// same-shape ones at once: KernelBackend::MuonUpdateBatch)
// (docs/reference/paddle_internals.md §3.4-3.5, Paddle "NEW": update on the fp32 master).
//
// For each matrix of the batch (rows x cols, row-major), with g the fp32
// gradient, m the fp32 momentum and p the fp32 master weight:
//
//   m = β·m + (1-β)·g                        (stored back)
//   u = (1-β)·g + β·m   if nesterov, else m
//   O = NewtonSchulz(u)                      (per matrix; NewtonSchulzOptions)
//   s = extra_scale · { sqrt(max(1, dout/din))   v1 (default)
//                       sqrt(dout/din)           v2
//                       sqrt(max(dout, din))     v3 }
//   p = p · (1 - lr·wd)                      (if with_decay; decoupled)
//   p = p - lr·s·O
//   model = bf16(p)                          (if a bf16 copy is given)
//
// din and dout come from the layout: kOutIn (PyTorch Linear, [out, in]) has
// dout = rows, din = cols; kInOut (Paddle Linear, [in, out]) has din = rows,
// dout = cols. For a 3-D stack they are per expert.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/bf16.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {

enum class WeightLayout {
  kOutIn,  // rows = dout, cols = din.
  kInOut,  // rows = din, cols = dout (Paddle).
};

enum class MuonScaleVersion {
  kV1 = 1,  // sqrt(max(1, dout/din)), Keller Jordan; Paddle's default.
  kV2 = 2,  // sqrt(dout/din), spectral.
  kV3 = 3,  // sqrt(max(dout, din)), Moonlight (with extra_scale 0.2).
};

struct MuonOptions {
  float beta = 0.95f;
  bool nesterov = true;
  float lr = 0.02f;
  float weight_decay = 0.01f;
  // Paddle's apply_decay_param_fun result for this parameter.
  bool with_decay = true;
  MuonScaleVersion scale_version = MuonScaleVersion::kV1;
  float extra_scale = 0.2f;
  NewtonSchulzOptions ns;
};

// Buffers of one Muon step, each shape.elements() long. All pointers are
// host memory for the CPU backend and device memory for the CUDA backend.
// The buffers must not overlap.
struct MuonTensors {
  const float* grad = nullptr;
  float* momentum = nullptr;  // In/out.
  float* master = nullptr;    // In/out, the fp32 master weight.
  Bf16Bits* model = nullptr;  // Optional out: bf16(master).
};

// The per-matrix update scale s·extra_scale for `layout`.
double MuonUpdateScale(int64_t rows, int64_t cols, WeightLayout layout, MuonScaleVersion version, float extra_scale);

// The apply step of one rows x cols matrix, p = p·decay - step·O:
// decay = 1 - lr·wd with decay (else 1), step = lr·MuonUpdateScale.
struct MuonApplyScalars {
  float decay = 1.0f;
  float step = 0.0f;
};
MuonApplyScalars MuonApplyScalarsFor(int64_t rows, int64_t cols, WeightLayout layout, const MuonOptions& options);

// NOTE [Muon in pieces]
// A matrix whose Newton-Schulz runs elsewhere (a tensor-parallel shard: NS
// must see the whole matrix, which is spread over ranks) takes the step in
// three pieces, element for element what MuonUpdate does on the whole
// matrix (bit-identical on the CPU):
//   MuonMomentum  m = β·m + (1-β)·g; update = the NS input (as above),
//   NewtonSchulz  of the whole update, wherever it is assembled,
//   MuonApply     p = p·decay - step·O and the optional bf16 model, with
//                 MuonApplyScalarsFor(whole rows, whole cols, ...).
// CPU implementations (host pointers; block until done). INVALID_ARGUMENT
// for n < 0, a null pointer with n > 0 (model may be null) or bad options.
absl::Status MuonMomentumCpu(const float* grad, float* momentum, float* update, int64_t n, const MuonOptions& options);
absl::Status MuonApplyCpu(const float* ortho, float* master, Bf16Bits* model, int64_t n,
                          const MuonApplyScalars& scalars);
// The checks both implementations share.
absl::Status ValidateMuonMomentumArgs(const float* grad, const float* momentum, const float* update, int64_t n,
                                      const MuonOptions& options);
absl::Status ValidateMuonApplyArgs(const float* ortho, const float* master, int64_t n);

// Validates everything but the pointers' memory space.
// Possible errors: INVALID_ARGUMENT.
absl::Status ValidateMuonArgs(const MuonTensors& tensors, const MatrixBatchShape& shape, const MuonOptions& options);

// Validates the arguments of a batched update (KernelBackend::
// MuonUpdateBatch) but the pointers' memory space: the shape and options
// once, then every item's pointers, and that no written buffer (momentum,
// master, model) of any item overlaps another buffer of the batch, its own
// item's included (gradients may overlap each other). Messages name the
// item index ("item 3: ..."). An empty `items` passes when the shape and
// options do.
// Possible errors: INVALID_ARGUMENT.
absl::Status ValidateMuonBatchArgs(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape,
                                   const MuonOptions& options);

// CPU implementation: host pointers; blocks until done. The matrices are
// spread over threads as NewtonSchulzCpu's, each with its momentum, decay
// and apply passes.
// Possible errors: INVALID_ARGUMENT.
absl::Status MuonUpdateCpu(const MuonTensors& tensors, const MatrixBatchShape& shape, WeightLayout layout,
                           const MuonOptions& options);

// CPU implementation of KernelBackend::MuonUpdateBatch: host pointers;
// blocks until done. Every matrix of every item goes through one loop (as
// one stack would in MuonUpdateCpu), and each item's result is
// bit-identical to MuonUpdateCpu(items[i], shape, layout, options). Nothing
// is written when validation fails.
// Possible errors: INVALID_ARGUMENT.
absl::Status MuonUpdateBatchCpu(absl::Span<const MuonTensors> items, const MatrixBatchShape& shape, WeightLayout layout,
                                const MuonOptions& options);

}  // namespace muonshard::kernels

#endif  // MUONSHARD_KERNELS_MUON_UPDATE_H_
