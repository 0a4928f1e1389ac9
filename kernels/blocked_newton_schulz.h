#ifndef MUONSHARD_KERNELS_BLOCKED_NEWTON_SCHULZ_H_
#define MUONSHARD_KERNELS_BLOCKED_NEWTON_SCHULZ_H_

// Per-block Newton–Schulz (docs/planner.md, "Fused weights: per-block
// Newton–Schulz"): a fused matrix (q | k | v, gate | up, per-head
// interleaved rows, gpt-oss's alternating columns) is orthogonalised block
// by block, each block being a set of rows (or columns) of every matrix of
// the batch:
//
//   for each block b: X_b = the rows (cols) of b, in order
//   O_b = NewtonSchulz(X_b)                  (newton_schulz.h)
//   O_b = s_b · O_b                          (optional: the Muon scale of
//                                             b's own rows x cols)
//   out[rows (cols) of b] = O_b
//
// Blocks of one shape go through one batched KernelBackend::NewtonSchulz
// (all experts x all those blocks); gathers and scatters are
// KernelBackend::Copy2D, so every backend runs it. The step passes scratch it
// allocated once (BlockedNsScratchFloats, BlockedMuonScratchFloats): those
// calls only enqueue work on the backend's stream. The overloads without
// scratch allocate it per call and synchronise before freeing it (tests and
// the reference optimizer).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/kernel_backend.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"

namespace muonshard::kernels {

enum class NsBlockAxis {
  kRows,  // blocks of rows (dimension -2)
  kCols,  // blocks of columns (dimension -1)
};

// One block: the indices begin + k·step (k < length) of the blocked axis.
// Contiguous blocks have step 1; gpt-oss's alternating columns are
// {0, L/2, 2} and {1, L/2, 2}.
struct NsBlock {
  int64_t begin = 0;
  int64_t length = 0;
  int64_t step = 1;
};

struct NsBlockSpec {
  NsBlockAxis axis = NsBlockAxis::kRows;
  std::vector<NsBlock> blocks;
};

// The Muon shape scale each block's result is multiplied by
// (MuonUpdateScale of the block's rows x cols).
struct NsBlockScale {
  WeightLayout layout = WeightLayout::kOutIn;
  MuonScaleVersion version = MuonScaleVersion::kV1;
  float extra_scale = 1.0f;
};

// Checks `spec` against `shape`: at least one block, every block non-empty
// with step >= 1, inside the axis, and the blocks tile the axis exactly
// (every index in one block). INVALID_ARGUMENT saying what is wrong.
absl::Status ValidateNsBlockSpec(const NsBlockSpec& spec, const MatrixBatchShape& shape);

// Orthogonalises each block of each matrix of `in` into `out`
// (shape.elements() floats each, in `backend`'s memory; `out` may equal
// `in`, not otherwise overlap it). With `scale`, each block's result is
// multiplied by its own Muon scale. Possible errors: INVALID_ARGUMENT (bad
// shape, spec or options), those of the backend's calls.
absl::Status BlockedNewtonSchulz(KernelBackend& backend, const float* in, float* out, const MatrixBatchShape& shape,
                                 const NsBlockSpec& spec, const NewtonSchulzOptions& options,
                                 const NsBlockScale* scale = nullptr);

// Floats of scratch BlockedNewtonSchulz needs for `spec` on `shape`: the
// largest group of same-length blocks packed, twice (with the scale).
// REQUIRES: ValidateNsBlockSpec(spec, shape).ok().
int64_t BlockedNsScratchFloats(const MatrixBatchShape& shape, const NsBlockSpec& spec);

// BlockedNewtonSchulz in `scratch`: at least BlockedNsScratchFloats floats of
// the backend's memory, not overlapping `in` or `out`. Enqueues the work and
// returns; the scratch may be reused once the backend's stream has run it.
absl::Status BlockedNewtonSchulz(KernelBackend& backend, const float* in, float* out, const MatrixBatchShape& shape,
                                 const NsBlockSpec& spec, const NewtonSchulzOptions& options, const NsBlockScale* scale,
                                 float* scratch);

// The apply step after a BlockedNewtonSchulz with the scale: the scale is in
// the orthogonalised values already, so p = p·decay - lr·O.
MuonApplyScalars BlockedMuonApplyScalars(const MuonOptions& options);

// The Muon step of MuonUpdate (muon_update.h) with per-block Newton–Schulz:
// MuonMomentum, BlockedNewtonSchulz with the per-block scale, MuonApply
// with BlockedMuonApplyScalars. Element-wise parts as MuonUpdate.
// Possible errors: as BlockedNewtonSchulz and MuonUpdate.
absl::Status BlockedMuonUpdate(KernelBackend& backend, const MuonTensors& tensors, const MatrixBatchShape& shape,
                               WeightLayout layout, const NsBlockSpec& spec, const MuonOptions& options);

// Floats of scratch BlockedMuonUpdate needs: the update, then
// BlockedNsScratchFloats. REQUIRES: ValidateNsBlockSpec(spec, shape).ok().
int64_t BlockedMuonScratchFloats(const MatrixBatchShape& shape, const NsBlockSpec& spec);

// BlockedMuonUpdate in `scratch` (at least BlockedMuonScratchFloats floats
// of the backend's memory, apart from the tensors), enqueued without a
// synchronisation, as MuonUpdate is.
absl::Status BlockedMuonUpdate(KernelBackend& backend, const MuonTensors& tensors, const MatrixBatchShape& shape,
                               WeightLayout layout, const NsBlockSpec& spec, const MuonOptions& options,
                               float* scratch);

}  // namespace muonshard::kernels

#endif  // MUONSHARD_KERNELS_BLOCKED_NEWTON_SCHULZ_H_
