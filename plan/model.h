#ifndef MUONSHARD_PLAN_MODEL_H_
#define MUONSHARD_PLAN_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/topology.h"

namespace re2 {
class RE2;
}  // namespace re2

namespace muonshard::planner {

// Bytes per element of a dtype; 0 for an unknown one.
int DTypeSize(v1::DType dtype);
// The gradient buffers' dtype of a plan's policy: grad_dtype, FP32 unless set.
v1::DType GradDType(const v1::PlanPolicy& policy);
// The name Paddle sorts dtypes by (`str(dtype)` order: bf16 < fp16 < fp32).
const char* DTypeName(v1::DType dtype);

// The dimension a TP split divides: `split` (TP_COLUMN or TP_ROW) of a
// tensor of `dims` dimensions and `layout` -- its out dimension for COLUMN,
// in for ROW, of the last two (OUT_IN: [.., out, in]; IN_OUT: [.., in, out]);
// a 1-D tensor's only dimension is out. -1 for ROW on a 1-D tensor.
int TpSplitDim(int dims, v1::Layout layout, v1::TpSplit split);

// Where tp rank `t`'s shard of a tensor of `whole_shape` split on `dim`
// (t-th of tp equal blocks along it) lies in the whole tensor, row-major:
// `runs` runs of `run` elements; run k starts at k * run in the shard and
// at offset + k * pitch in the whole tensor. The one definition of a TP
// shard's place, for the worker's gather/scatter, workloads and checkpoints.
struct TpShardRuns {
  int64_t runs = 0;
  int64_t run = 0;
  int64_t pitch = 0;
  int64_t offset = 0;
  // The whole tensor's flattened index of the shard's element `local`.
  int64_t WholeIndex(int64_t local) const { return offset + (local / run) * pitch + local % run; }
};
// REQUIRES: 0 <= dim < whole_shape.size(), whole_shape[dim] % tp == 0, 0 <= t < tp.
TpShardRuns TpShardRunsOf(absl::Span<const int64_t> whole_shape, int dim, int tp, int t);

// A planned tensor of a plan with tp > 1 that ranks hold as TP shards
// (tp_split COLUMN or ROW, local_shape set); the shape and element count a
// rank holds of it (the shard's, else the tensor's); and where tp rank t's
// shard of it lies in the whole tensor (REQUIRES: IsTpSplit(tensor)).
bool IsTpSplit(const v1::PlannedTensor& tensor);
// A tensor every tp rank of a replica holds a whole copy of (tp > 1): not
// split, and not an expert under ep > 1 (colour MOE_EXPERT), which one tp
// rank holds. Its copies are equal: one of them (tp rank 0's) is written.
bool IsTpReplicated(const v1::PlannedTensor& tensor, int tp);
const google::protobuf::RepeatedField<int64_t>& HeldShape(const v1::PlannedTensor& tensor);
int64_t HeldNumel(const v1::PlannedTensor& tensor);
// Not for a tensor tiled over a multi-dimensional tp mesh (tp_mesh_split):
// its tile is TpTileOf(tensor, topology, t) (tp_mesh.h).
TpShardRuns TpShardRunsOf(const v1::PlannedTensor& tensor, int tp, int t);

// Newton-Schulz FLOPs of one m x n matrix: steps * (4 a^2 b + 2 a^3) with
// a = min(m, n), b = max(m, n).
double NsFlops(int64_t rows, int64_t cols, int steps);

// How each tp rank runs Newton-Schulz on its own shard of one matrix of a
// split Muon tensor under TP_MUON_SHARDED (NOTE [Sharded Newton-Schulz] in
// kernels/newton_schulz.h): the shard splits the matrix (the last two
// dimensions) along `rows` or its columns; the Gram matrices are m x m, m =
// min(rows, cols) of the whole matrix, and a shard's long side is
// n_local = max(rows, cols) / tp.
struct ShardedNs {
  bool rows = false;
  int64_t m = 0;
  int64_t n_local = 0;
  // Per rank and matrix: steps * (4 m^2 n_local + 2 m^3) FLOPs, and the
  // floats of the all-reduces (steps Gram matrices and the norm).
  double Flops(int steps) const;
  int64_t AllReducedFloats(int steps) const { return steps * m * m + 1; }
};
// Sharded NS of a rows x cols matrix split `tp` ways along its rows (else
// its columns): the Gram matrix sums over the split axis, so its side is the
// other one, whichever is shorter (Megatron's `distributed` mode does this
// for any split; muonshard only for a split along the long side, ShardedNsOf).
ShardedNs ShardedNsGeometry(int64_t rows, int64_t cols, bool rows_split, int tp);
// A split Muon tensor that can: split along one of its matrices' two axes
// only (not a tp mesh's tile), the long one (either of a square matrix), and
// no NS blocks. Else nullopt: such a tensor is gathered (TP_OP_GATHER_SCATTER).
std::optional<ShardedNs> ShardedNsOf(const v1::PlannedTensor& tensor);

// The Muon exclusion patterns (case-insensitive regexes) compiled for speed:
// a pattern that is a plain literal (optionally anchored by ^ or $, with
// backslash-escaped punctuation) is matched as a case-insensitive substring,
// which gives RE2's answer without running a regex per tensor name; the rest
// go through one RE2 alternation.
class ExcludeMatcher {
 public:
  static absl::StatusOr<ExcludeMatcher> Create(const std::vector<std::string>& patterns);
  bool Matches(absl::string_view name) const;
  // True when every pattern is a literal without digits: then a name matches
  // iff the name with each run of digits replaced by one '0' does (a
  // digit-free literal can only match inside digit-free stretches), so
  // callers may memoise by that skeleton ("layers.0.mlp.experts.0...").
  bool digit_agnostic() const { return regex_ == nullptr && digit_free_; }

 private:
  struct Literal {
    std::string lower;
    bool at_start = false;
    bool at_end = false;
  };
  std::vector<Literal> literals_;
  // For each byte, the literals whose first character it is (lower case), so
  // one pass over a name tests every literal at the positions that matter.
  std::vector<std::vector<int>> by_first_char_;
  std::shared_ptr<const re2::RE2> regex_;  // Defined in name_scanner.cc: no re2 in this header.
  bool digit_free_ = true;
};

// A tensor of the manifest after validation and classification.
struct ResolvedTensor {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  int64_t numel = 0;
  int esize = 0;
  bool muon = false;
  v1::Layout layout = v1::OUT_IN;
  int stage = 0;
  int expert = -1;     // per-expert tensor index, -1 otherwise
  bool stack = false;  // fused expert stack: dim 0 indexes experts
  // Tensor parallelism (tp > 1 only): the dimension split over the tp
  // ranks, -1 when replicated.
  int tp_dim = -1;
  // Muon view: `matrices` matrices of rows x cols (the last two dims).
  int matrices = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  // The matrix Newton-Schulz sees: rows x cols, except for a TP shard
  // (tensor_parallel.h), whose whole matrix is gathered first.
  int64_t ns_rows = 0;
  int64_t ns_cols = 0;
  // Newton-Schulz FLOPs of one iteration on one such matrix: NsFlops(ns_rows,
  // ns_cols, 1), or with TensorSpec.ns_blocks the sum over its blocks
  // (ns_blocks.h). MatrixNsFlops scales it by the steps.
  double ns_flops_per_step = 0;
  // The blocks align with the TP split (tp > 1; NsBlocksAlignWithTp): each
  // tp rank orthogonalises its own shard's blocks, nothing is gathered.
  // ns_flops_per_step stays the whole matrix's, the sum over the tp ranks.
  bool ns_local = false;
};

// Newton-Schulz FLOPs of one matrix of `t` with `steps` iterations.
inline double MatrixNsFlops(const ResolvedTensor& t, int steps) { return steps * t.ns_flops_per_step; }

// The part of a tensor that lives in one comm group; the unit everything is
// partitioned and bucketed by. Whole tensors are one unit.
struct Unit {
  int tensor = 0;
  int group = 0;
  int64_t elem_begin = 0;
  int64_t numel = 0;
  int matrix_begin = 0;
  int matrix_end = 1;
};

struct ResolvedModel {
  std::vector<ResolvedTensor> tensors;
  std::vector<Unit> units;  // tensor-major, in manifest order
  // Per group id: unit indices in manifest order.
  std::vector<std::vector<int>> muon_units;
  std::vector<std::vector<int>> adamw_units;
};

// Validates the manifest against the topology and the classification
// patterns, and splits it into units. INVALID_ARGUMENT names the tensor.
absl::StatusOr<ResolvedModel> ResolveModel(const v1::ModelManifest& manifest, const RankLayout& layout,
                                           const std::vector<std::string>& exclude_patterns);

// The default Muon exclusion patterns (case-insensitive regexes).
const std::vector<std::string>& DefaultExcludePatterns();

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_MODEL_H_
