#include "kernels/blocked_newton_schulz.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::kernels {
namespace {

constexpr int64_t kFloat = sizeof(float);

int64_t AxisLength(const NsBlockSpec& spec, const MatrixBatchShape& shape) {
  return spec.axis == NsBlockAxis::kRows ? shape.rows : shape.cols;
}

// The rows x cols of one block's matrix.
MatrixBatchShape BlockShape(const NsBlockSpec& spec, const MatrixBatchShape& shape, int64_t length, int64_t batch) {
  return spec.axis == NsBlockAxis::kRows ? MatrixBatchShape{batch, length, shape.cols}
                                         : MatrixBatchShape{batch, shape.rows, length};
}

// Copies block `b` of one matrix (`matrix`, rows x cols) to or from the
// packed block matrix `packed`.
absl::Status CopyBlock(KernelBackend& backend, const NsBlockSpec& spec, const MatrixBatchShape& shape, const NsBlock& b,
                       float* matrix, float* packed, bool to_packed) {
  const int64_t r = shape.rows, c = shape.cols;
  auto copy = [&](float* m, int64_t m_pitch, float* p, int64_t p_pitch, int64_t run, int64_t runs) {
    return to_packed ? backend.Copy2D(m, m_pitch * kFloat, p, p_pitch * kFloat, run * kFloat, runs)
                     : backend.Copy2D(p, p_pitch * kFloat, m, m_pitch * kFloat, run * kFloat, runs);
  };
  if (spec.axis == NsBlockAxis::kRows) return copy(matrix + b.begin * c, b.step * c, packed, c, c, b.length);
  if (b.step == 1) return copy(matrix + b.begin, c, packed, b.length, b.length, r);
  // Strided columns: one run per element; one call when the stride runs on
  // from one row into the next (the block spans the whole axis).
  if (b.step * b.length == c) return copy(matrix + b.begin, b.step, packed, 1, 1, r * b.length);
  for (int64_t i = 0; i < r; ++i) {
    MUONSHARD_RETURN_IF_ERROR(copy(matrix + i * c + b.begin, b.step, packed + i * b.length, 1, 1, b.length));
  }
  return absl::OkStatus();
}

// The blocks of `spec` grouped by length, in order of first appearance.
std::vector<std::vector<int>> GroupsByLength(const NsBlockSpec& spec) {
  std::vector<std::vector<int>> groups;
  for (int i = 0; i < static_cast<int>(spec.blocks.size()); ++i) {
    bool placed = false;
    for (std::vector<int>& g : groups) {
      if (spec.blocks[g[0]].length == spec.blocks[i].length) {
        g.push_back(i);
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({i});
  }
  return groups;
}

// The packed shape of one group of same-length blocks: every matrix's
// blocks of the group, side by side in the batch.
MatrixBatchShape PackedShape(const NsBlockSpec& spec, const MatrixBatchShape& shape, const std::vector<int>& group) {
  return BlockShape(spec, shape, spec.blocks[group[0]].length, shape.batch * static_cast<int64_t>(group.size()));
}

// One group of same-length blocks: gather, one batched NS, scale, scatter,
// in `scratch` (BlockedNsScratchFloats floats).
absl::Status RunGroup(KernelBackend& backend, const float* in, float* out, const MatrixBatchShape& shape,
                      const NsBlockSpec& spec, const std::vector<int>& group, const NewtonSchulzOptions& options,
                      const NsBlockScale* scale, float* scratch) {
  const int64_t nb = static_cast<int64_t>(group.size());
  const MatrixBatchShape packed_shape = PackedShape(spec, shape, group);
  const int64_t block_numel = packed_shape.matrix_elements();
  float* packed = scratch;
  float* source = const_cast<float*>(in);  // read only: to_packed copies never write it
  for (int64_t e = 0; e < shape.batch; ++e) {
    for (int64_t j = 0; j < nb; ++j) {
      MUONSHARD_RETURN_IF_ERROR(CopyBlock(backend, spec, shape, spec.blocks[group[j]],
                                          source + e * shape.matrix_elements(), packed + (e * nb + j) * block_numel,
                                          /*to_packed=*/true));
    }
  }
  MUONSHARD_RETURN_IF_ERROR(backend.NewtonSchulz(packed, packed, packed_shape, options));
  float* result = packed;
  if (scale != nullptr) {
    // scaled = 0·0 - (-s)·O = s·O, through the backend's apply kernel.
    result = scratch + packed_shape.elements();
    const double s =
        MuonUpdateScale(packed_shape.rows, packed_shape.cols, scale->layout, scale->version, scale->extra_scale);
    MUONSHARD_RETURN_IF_ERROR(backend.MuonApply(packed, result, nullptr, packed_shape.elements(),
                                                MuonApplyScalars{0.0f, -static_cast<float>(s)}));
  }
  for (int64_t e = 0; e < shape.batch; ++e) {
    for (int64_t j = 0; j < nb; ++j) {
      MUONSHARD_RETURN_IF_ERROR(CopyBlock(backend, spec, shape, spec.blocks[group[j]],
                                          out + e * shape.matrix_elements(), result + (e * nb + j) * block_numel,
                                          /*to_packed=*/false));
    }
  }
  return absl::OkStatus();
}

// `floats` floats of the backend's memory, or an error.
absl::StatusOr<BackendMemory> AllocateFloats(KernelBackend& backend, int64_t floats) {
  return backend.Allocate(floats * kFloat);
}

}  // namespace

absl::Status ValidateNsBlockSpec(const NsBlockSpec& spec, const MatrixBatchShape& shape) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMatrixBatchShape(shape));
  const int64_t length = AxisLength(spec, shape);
  const char* axis = spec.axis == NsBlockAxis::kRows ? "rows" : "cols";
  if (spec.blocks.empty()) return absl::InvalidArgumentError("ns blocks: no blocks");
  std::vector<char> covered(static_cast<size_t>(length), 0);
  for (size_t i = 0; i < spec.blocks.size(); ++i) {
    const NsBlock& b = spec.blocks[i];
    if (b.length <= 0 || b.step <= 0 || b.begin < 0 || b.begin + (b.length - 1) * b.step >= length) {
      return absl::InvalidArgumentError(absl::StrCat("ns block ", i, " (begin ", b.begin, ", length ", b.length,
                                                     ", step ", b.step, ") is empty or outside the ", length, " ",
                                                     axis));
    }
    for (int64_t k = 0; k < b.length; ++k) {
      char& c = covered[b.begin + k * b.step];
      if (c != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("ns blocks overlap at ", axis, " index ", b.begin + k * b.step, " (block ", i, ")"));
      }
      c = 1;
    }
  }
  for (int64_t i = 0; i < length; ++i) {
    if (covered[i] == 0)
      return absl::InvalidArgumentError(absl::StrCat("ns blocks leave ", axis, " index ", i, " out"));
  }
  return absl::OkStatus();
}

int64_t BlockedNsScratchFloats(const MatrixBatchShape& shape, const NsBlockSpec& spec) {
  int64_t most = 0;
  for (const std::vector<int>& group : GroupsByLength(spec)) {
    most = std::max(most, PackedShape(spec, shape, group).elements());
  }
  return 2 * most;  // the packed blocks and their scaled results
}

int64_t BlockedMuonScratchFloats(const MatrixBatchShape& shape, const NsBlockSpec& spec) {
  return shape.elements() + BlockedNsScratchFloats(shape, spec);
}

absl::Status BlockedNewtonSchulz(KernelBackend& backend, const float* in, float* out, const MatrixBatchShape& shape,
                                 const NsBlockSpec& spec, const NewtonSchulzOptions& options, const NsBlockScale* scale,
                                 float* scratch) {
  if (in == nullptr || out == nullptr || scratch == nullptr) {
    return absl::InvalidArgumentError("BlockedNewtonSchulz: null pointer");
  }
  MUONSHARD_RETURN_IF_ERROR(ValidateNsBlockSpec(spec, shape));
  MUONSHARD_RETURN_IF_ERROR(ResolveNsCoefficients(options).status());
  // Every group reads only its own blocks of `in` before writing them to
  // `out`, and blocks are disjoint, so out == in is safe.
  for (const std::vector<int>& group : GroupsByLength(spec)) {
    MUONSHARD_RETURN_IF_ERROR(RunGroup(backend, in, out, shape, spec, group, options, scale, scratch));
  }
  return absl::OkStatus();
}

absl::Status BlockedNewtonSchulz(KernelBackend& backend, const float* in, float* out, const MatrixBatchShape& shape,
                                 const NsBlockSpec& spec, const NewtonSchulzOptions& options,
                                 const NsBlockScale* scale) {
  MUONSHARD_RETURN_IF_ERROR(ValidateNsBlockSpec(spec, shape));
  MUONSHARD_ASSIGN_OR_RETURN(BackendMemory scratch, AllocateFloats(backend, BlockedNsScratchFloats(shape, spec)));
  MUONSHARD_RETURN_IF_ERROR(
      BlockedNewtonSchulz(backend, in, out, shape, spec, options, scale, static_cast<float*>(scratch.get())));
  // The scratch is freed on return: let the backend finish with it first.
  return backend.Synchronize();
}

MuonApplyScalars BlockedMuonApplyScalars(const MuonOptions& options) {
  MuonApplyScalars scalars = MuonApplyScalarsFor(1, 1, WeightLayout::kOutIn, options);
  scalars.step = options.lr;
  return scalars;
}

absl::Status BlockedMuonUpdate(KernelBackend& backend, const MuonTensors& tensors, const MatrixBatchShape& shape,
                               WeightLayout layout, const NsBlockSpec& spec, const MuonOptions& options,
                               float* scratch) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonArgs(tensors, shape, options));
  MUONSHARD_RETURN_IF_ERROR(ValidateNsBlockSpec(spec, shape));
  if (scratch == nullptr) return absl::InvalidArgumentError("BlockedMuonUpdate: null scratch");
  const int64_t n = shape.elements();
  float* update = scratch;
  MUONSHARD_RETURN_IF_ERROR(backend.MuonMomentum(tensors.grad, tensors.momentum, update, n, options));
  const NsBlockScale scale{layout, options.scale_version, options.extra_scale};
  MUONSHARD_RETURN_IF_ERROR(BlockedNewtonSchulz(backend, update, update, shape, spec, options.ns, &scale, scratch + n));
  return backend.MuonApply(update, tensors.master, tensors.model, n, BlockedMuonApplyScalars(options));
}

absl::Status BlockedMuonUpdate(KernelBackend& backend, const MuonTensors& tensors, const MatrixBatchShape& shape,
                               WeightLayout layout, const NsBlockSpec& spec, const MuonOptions& options) {
  MUONSHARD_RETURN_IF_ERROR(ValidateMuonArgs(tensors, shape, options));
  MUONSHARD_RETURN_IF_ERROR(ValidateNsBlockSpec(spec, shape));
  MUONSHARD_ASSIGN_OR_RETURN(BackendMemory scratch, AllocateFloats(backend, BlockedMuonScratchFloats(shape, spec)));
  MUONSHARD_RETURN_IF_ERROR(
      BlockedMuonUpdate(backend, tensors, shape, layout, spec, options, static_cast<float*>(scratch.get())));
  return backend.Synchronize();
}

}  // namespace muonshard::kernels
