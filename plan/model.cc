#include "plan/model.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "plan/name_scanner.h"
#include "plan/ns_blocks.h"
#include "plan/tp_mesh.h"

namespace muonshard::planner {
namespace {

constexpr int kMaxDims = 8;
// Largest element count we accept: 12 bytes of optimizer state per element
// must still fit an int64 byte count with room for sums across tensors.
constexpr int64_t kMaxNumel = int64_t{1} << 50;

absl::Status TensorError(const v1::TensorSpec& t, int index, absl::string_view what) {
  if (t.name().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor #", index, ": ", what));
  }
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name(), "\": ", what));
}

// Shape, dtype and optimizer checks of one tensor; fills numel/esize/shape view.
absl::Status CheckTensor(const v1::TensorSpec& t, int index, ResolvedTensor* out) {
  if (t.name().empty()) return TensorError(t, index, "name is empty");
  if (t.shape_size() == 0) return TensorError(t, index, "shape is empty");
  if (t.shape_size() > kMaxDims) {
    return TensorError(t, index,
                       absl::StrCat("shape has ", t.shape_size(), " dimensions, at most ", kMaxDims, " are supported"));
  }
  int64_t numel = 1;
  for (int d = 0; d < t.shape_size(); ++d) {
    int64_t dim = t.shape(d);
    if (dim == 0) return TensorError(t, index, "shape has a 0 dimension");
    if (dim < 0) return TensorError(t, index, absl::StrCat("shape has a negative dimension (", dim, ")"));
    if (numel > kMaxNumel / dim) {
      return TensorError(t, index, absl::StrCat("element count overflows (more than 2^50 elements)"));
    }
    numel *= dim;
  }
  if (t.dtype() == v1::DTYPE_UNSPECIFIED) return TensorError(t, index, "dtype is missing");
  out->esize = DTypeSize(t.dtype());
  if (out->esize == 0) {
    return TensorError(t, index,
                       absl::StrCat("unknown dtype ", static_cast<int>(t.dtype()), " (expected BF16, FP16 or FP32)"));
  }
  if (!v1::Optimizer_IsValid(t.optimizer())) {
    return TensorError(t, index, absl::StrCat("unknown optimizer ", static_cast<int>(t.optimizer())));
  }
  if (!v1::TpSplit_IsValid(t.tp_split())) {
    return TensorError(t, index, absl::StrCat("unknown tp_split ", static_cast<int>(t.tp_split())));
  }
  if (!v1::Layout_IsValid(t.layout())) {
    return TensorError(t, index, absl::StrCat("unknown layout ", static_cast<int>(t.layout())));
  }
  if (t.optimizer() == v1::MUON && t.shape_size() != 2 && t.shape_size() != 3) {
    return TensorError(
        t, index, absl::StrCat("optimizer MUON needs a 2-D or 3-D tensor, shape has ", t.shape_size(), " dimensions"));
  }
  if (t.has_expert() && t.expert() < 0) {
    return TensorError(t, index, absl::StrCat("expert must be >= 0, got ", t.expert()));
  }
  out->dtype = t.dtype();
  out->numel = numel;
  out->layout = t.layout() == v1::IN_OUT ? v1::IN_OUT : v1::OUT_IN;
  int n = t.shape_size();
  out->rows = n >= 2 ? t.shape(n - 2) : 1;
  out->cols = t.shape(n - 1);
  out->matrices = static_cast<int>(n == 3 ? t.shape(0) : 1);
  out->ns_rows = out->rows;
  out->ns_cols = out->cols;
  out->ns_flops_per_step = NsFlops(out->rows, out->cols, 1);
  return absl::OkStatus();
}

// What the per-tensor pass learns for stage and expert placement, which
// need the whole manifest (layer count, expert count) before they resolve.
struct Placement {
  std::vector<int> layer;  // "layers.N" index, -1 if none
  std::vector<bool> explicit_stage;
  int num_layers = 0;
  int num_experts = 0;
  // The first error of each kind in manifest order; the stage error wins.
  absl::Status stage_error;
  absl::Status expert_error;
};

// Explicit stage and expert of tensor i, checked; records the first error
// of each kind rather than returning, so that shape and name errors of
// later tensors still come first.
void PlaceTensor(const v1::TensorSpec& t, int i, const RankLayout& layout, const NameScanner::Facts& facts,
                 ResolvedTensor& r, Placement& p) {
  p.layer[i] = facts.layer;
  p.num_layers = std::max(p.num_layers, facts.layer + 1);
  if (t.has_stage()) {
    p.explicit_stage[i] = true;
    r.stage = t.stage();
    if ((t.stage() < 0 || t.stage() >= layout.pp()) && p.stage_error.ok()) {
      p.stage_error = TensorError(t, i, absl::StrCat("stage ", t.stage(), " is outside [0, pp=", layout.pp(), ")"));
    }
  }
  if (t.has_expert()) {
    if (facts.expert >= 0 && facts.expert != t.expert() && p.expert_error.ok()) {
      p.expert_error =
          TensorError(t, i, absl::StrCat("expert ", t.expert(), " disagrees with the name's experts.", facts.expert));
    }
    r.expert = t.expert();
  } else {
    r.expert = facts.expert;
  }
  if (r.expert >= 0) {
    p.num_experts = std::max(p.num_experts, r.expert + 1);
  } else if (facts.expert_stack && t.shape_size() >= 2) {
    r.stack = true;
  }
}

// Muon for an explicit MUON, or when classifying a 2-D or 3-D tensor. A 2-D
// fused expert stack [experts, n] holds one vector per expert: AdamW, like a
// 1-D tensor, and MUON on it is refused (its matrices would be rows of one
// expert each, split over the ep ranks).
absl::Status ChooseOptimizer(const v1::TensorSpec& t, int index, bool classify_as_matrix, ResolvedTensor& r) {
  const bool vector_stack = r.stack && t.shape_size() == 2;
  if (vector_stack && t.optimizer() == v1::MUON) {
    return TensorError(t, index,
                       absl::StrCat("optimizer MUON on a 2-D expert stack (", t.shape(0), " experts of ", t.shape(1),
                                    " elements each): Muon needs a matrix per expert, "
                                    "i.e. a 3-D stack [experts, rows, cols]"));
  }
  if (t.optimizer() != v1::OPTIMIZER_UNSPECIFIED) {
    r.muon = t.optimizer() == v1::MUON;
  } else {
    r.muon = classify_as_matrix && !vector_stack && (t.shape_size() == 2 || t.shape_size() == 3);
  }
  return absl::OkStatus();
}

// A split per tp mesh dimension (NOTE [TP mesh tiles] in tp_mesh.h),
// checked: instead of tp_split, one value per mesh dimension, even tiles,
// no expert tensors and no per-block Newton-Schulz (its blocks would cross
// the tiles of a strided or 2-D split). r.tp_dim stays -1 (ns_local is off).
absl::Status ResolveTpMeshSplit(const v1::TensorSpec& t, int index, const RankLayout& layout, ResolvedTensor& r) {
  if (t.tp_split() != v1::TP_SPLIT_UNSPECIFIED) {
    return TensorError(t, index, "set tp_split or tp_mesh_split, not both");
  }
  if (layout.tp_mesh().size() != static_cast<size_t>(t.tp_mesh_split_size())) {
    return TensorError(
        t, index,
        absl::StrCat("tp_mesh_split has ", t.tp_mesh_split_size(), " values but the topology's tp mesh has ",
                     layout.tp_mesh().size(), " dimensions (topology.tp_mesh)"));
  }
  const std::vector<v1::TpSplit> splits = MeshSplitOf(t.tp_mesh_split(), t.tp_split());
  if (!AnyMeshSplit(splits)) return absl::OkStatus();
  if (r.expert >= 0 || r.stack) {
    return TensorError(t, index, "tp_mesh_split on an expert tensor: experts are not tiled over a tp mesh");
  }
  if (t.has_ns_blocks()) {
    return TensorError(t, index,
                       "ns_blocks with tp_mesh_split: per-block Newton-Schulz of a tensor tiled over a tp mesh is "
                       "not supported");
  }
  absl::Status s = CheckTpTiles(t.shape(), r.layout, layout.tp_mesh(), splits);
  if (!s.ok()) return TensorError(t, index, absl::StrCat("tp_mesh_split: ", s.message()));
  return absl::OkStatus();
}

// The dimension a TP split divides: out or in of the tensor's layout (the
// last two dimensions; a 1-D tensor's only one is out). Checked against tp:
// divisible, ROW only with two or more dimensions, and no split of expert
// tensors under expert parallelism (Paddle's expert_tensor_parallel_degree
// <= 1: experts are spread over the tp ranks whole).
absl::Status ResolveTpSplit(const v1::TensorSpec& t, int index, const RankLayout& layout, ResolvedTensor& r) {
  if (t.tp_mesh_split_size() > 0) return ResolveTpMeshSplit(t, index, layout, r);
  const v1::TpSplit split = t.tp_split();
  if (layout.tp() == 1 || split == v1::TP_SPLIT_UNSPECIFIED || split == v1::TP_REPLICATED) return absl::OkStatus();
  const int n = t.shape_size();
  const char* name = split == v1::TP_COLUMN ? "TP_COLUMN" : "TP_ROW";
  if (split == v1::TP_ROW && n < 2) {
    return TensorError(t, index,
                       "tp_split TP_ROW needs a tensor of 2 or more dimensions (a 1-D tensor splits along out)");
  }
  if (layout.ep() > 1 && (r.expert >= 0 || r.stack)) {
    return TensorError(t, index,
                       absl::StrCat("tp_split ", name, " on an expert tensor with ep ", layout.ep(),
                                    ": experts are not split over tensor parallelism, only spread"));
  }
  const int dim = TpSplitDim(n, r.layout, split);
  if (t.shape(dim) % layout.tp() != 0) {
    return TensorError(t, index,
                       absl::StrCat("tp_split ", name, ": dimension ", dim, " (", t.shape(dim),
                                    ") is not divisible by tp ", layout.tp()));
  }
  r.tp_dim = dim;
  return absl::OkStatus();
}

// Per-block Newton-Schulz (ns_blocks.h): only on a Muon matrix, tiling its
// axis exactly. The blocks give the FLOPs, and with a TP split along their
// axis that leaves whole blocks on every tp rank, the tensor is
// orthogonalised shard by shard.
absl::Status ResolveNsBlocks(const v1::TensorSpec& t, int index, const RankLayout& layout, ResolvedTensor& r) {
  if (!t.has_ns_blocks()) return absl::OkStatus();
  const v1::NsBlocks& blocks = t.ns_blocks();
  if (!r.muon) {
    return TensorError(t, index,
                       absl::StrCat("ns_blocks ", NsBlocksText(blocks),
                                    " on a tensor that uses AdamW: per-block Newton-Schulz needs a Muon matrix "
                                    "(2-D, or a 3-D expert stack)"));
  }
  absl::Status s = CheckNsBlocks(blocks, t.shape());
  if (!s.ok()) return TensorError(t, index, s.message());
  r.ns_flops_per_step = BlockedNsFlops(&blocks, r.rows, r.cols, 1);
  r.ns_local = r.tp_dim >= 0 && NsBlocksAlignWithTp(blocks, t.shape(), r.tp_dim, layout.tp());
  return absl::OkStatus();
}

// Stage of every tensor: explicit, else from "layers.N" in contiguous equal
// blocks, else the stage of the closest preceding layered tensor (embedding
// -> first stage; final norm and lm_head -> last).
void AssignStages(const Placement& p, int pp, std::vector<ResolvedTensor>& tensors) {
  const int n = static_cast<int>(tensors.size());
  int current = 0;
  for (int i = 0; i < n; ++i) {
    if (p.explicit_stage[i]) {
      current = tensors[i].stage;
    } else if (p.layer[i] >= 0) {
      current = static_cast<int>(int64_t{p.layer[i]} * pp / p.num_layers);
    }
    tensors[i].stage = current;
  }
  // Trailing untagged tensors (final norm, lm_head) belong to the last stage.
  for (int i = n - 1; i >= 0; --i) {
    if (p.explicit_stage[i] || p.layer[i] >= 0) break;
    if (p.num_layers > 0) tensors[i].stage = pp - 1;
  }
}

// Splits a tensor into its units: one per ep rank for a fused expert stack
// under expert parallelism, else one.
absl::Status AddUnits(const v1::TensorSpec& t, int index, const ResolvedTensor& r, const RankLayout& layout,
                      int num_experts, ResolvedModel* model) {
  auto add = [&](int group, int64_t begin, int64_t numel, int mb, int me) {
    int u = static_cast<int>(model->units.size());
    model->units.push_back(Unit{index, group, begin, numel, mb, me});
    (r.muon ? model->muon_units : model->adamw_units)[group].push_back(u);
  };
  if (layout.ep() == 1) {
    add(layout.DefaultGroup(r.stage), 0, r.numel, 0, r.matrices);
    return absl::OkStatus();
  }
  if (r.expert >= 0) {
    int per_rank = num_experts / layout.ep();
    add(layout.MoeGroup(r.stage, r.expert / per_rank), 0, r.numel, 0, r.matrices);
    return absl::OkStatus();
  }
  if (!r.stack) {
    add(layout.DefaultGroup(r.stage), 0, r.numel, 0, r.matrices);
    return absl::OkStatus();
  }
  int64_t experts = t.shape(0);
  if (experts % layout.ep() != 0) {
    return TensorError(t, index,
                       absl::StrCat("expert stack of ", experts, " experts is not divisible by ep ", layout.ep()));
  }
  int64_t per_rank = experts / layout.ep();
  int64_t per_expert = r.numel / experts;
  for (int e = 0; e < layout.ep(); ++e) {
    int mb = r.muon ? static_cast<int>(e * per_rank) : 0;
    int me = r.muon ? static_cast<int>((e + 1) * per_rank) : 1;
    add(layout.MoeGroup(r.stage, e), e * per_rank * per_expert, per_rank * per_expert, mb, me);
  }
  return absl::OkStatus();
}

}  // namespace

v1::DType GradDType(const v1::PlanPolicy& policy) {
  return policy.grad_dtype() == v1::DTYPE_UNSPECIFIED ? v1::FP32 : policy.grad_dtype();
}

int DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
    case v1::FP16:
      return 2;
    case v1::FP32:
      return 4;
    default:
      return 0;
  }
}

const char* DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::BF16:
      return "bfloat16";
    case v1::FP16:
      return "float16";
    case v1::FP32:
      return "float32";
    default:
      return "unknown";
  }
}

TpShardRuns TpShardRunsOf(absl::Span<const int64_t> whole_shape, int dim, int tp, int t) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= whole_shape[d];
  for (size_t d = dim + 1; d < whole_shape.size(); ++d) inner *= whole_shape[d];
  const int64_t block = whole_shape[dim] / tp * inner;
  TpShardRuns r;
  r.runs = outer;
  r.run = block;
  r.pitch = whole_shape[dim] * inner;
  r.offset = t * block;
  return r;
}

bool IsTpReplicated(const v1::PlannedTensor& tensor, int tp) {
  return tp > 1 && !IsTpSplit(tensor) && tensor.colour() != v1::MOE_EXPERT;
}

bool IsTpSplit(const v1::PlannedTensor& tensor) {
  return AnyMeshSplit(MeshSplitOf(tensor.tp_mesh_split(), tensor.tp_split())) && tensor.local_shape_size() > 0;
}

const google::protobuf::RepeatedField<int64_t>& HeldShape(const v1::PlannedTensor& tensor) {
  return IsTpSplit(tensor) ? tensor.local_shape() : tensor.shape();
}

int64_t HeldNumel(const v1::PlannedTensor& tensor) { return IsTpSplit(tensor) ? tensor.local_numel() : tensor.numel(); }

TpShardRuns TpShardRunsOf(const v1::PlannedTensor& tensor, int tp, int t) {
  return TpShardRunsOf(tensor.shape(), TpSplitDim(tensor.shape_size(), tensor.layout(), tensor.tp_split()), tp, t);
}

int TpSplitDim(int dims, v1::Layout layout, v1::TpSplit split) {
  if (dims == 1) return split == v1::TP_COLUMN ? 0 : -1;
  const bool out_first = layout != v1::IN_OUT;
  const int out_dim = out_first ? dims - 2 : dims - 1;
  const int in_dim = out_first ? dims - 1 : dims - 2;
  return split == v1::TP_COLUMN ? out_dim : in_dim;
}

double ShardedNs::Flops(int steps) const {
  const double a = static_cast<double>(m);
  return steps * (4.0 * a * a * static_cast<double>(n_local) + 2.0 * a * a * a);
}

std::optional<ShardedNs> ShardedNsOf(const v1::PlannedTensor& tensor) {
  const int n = tensor.shape_size();
  if (!IsTpSplit(tensor) || n < 2 || tensor.local_shape_size() != n || tensor.has_ns_blocks()) return std::nullopt;
  for (int d = 0; d < n - 2; ++d) {
    if (tensor.local_shape(d) != tensor.shape(d)) return std::nullopt;
  }
  const int64_t rows = tensor.shape(n - 2), cols = tensor.shape(n - 1);
  const bool rows_split = tensor.local_shape(n - 2) != rows;
  const bool cols_split = tensor.local_shape(n - 1) != cols;
  if (rows_split == cols_split) return std::nullopt;
  if (rows_split ? rows < cols : cols < rows) return std::nullopt;  // split along the short side
  // The Gram side is the unsplit (short) axis; a shard holds n_local of the other.
  return ShardedNs{rows_split, rows_split ? cols : rows,
                   rows_split ? tensor.local_shape(n - 2) : tensor.local_shape(n - 1)};
}

ShardedNs ShardedNsGeometry(int64_t rows, int64_t cols, bool rows_split, int tp) {
  return ShardedNs{rows_split, rows_split ? cols : rows, (rows_split ? rows : cols) / std::max(1, tp)};
}

double NsFlops(int64_t rows, int64_t cols, int steps) {
  double a = static_cast<double>(std::min(rows, cols));
  double b = static_cast<double>(std::max(rows, cols));
  return steps * (4.0 * a * a * b + 2.0 * a * a * a);
}

const std::vector<std::string>& DefaultExcludePatterns() {
  static const auto* const kPatterns =
      new std::vector<std::string>{"embed", "lm_head", "bias", R"(\.gate\.weight$)", "router", "sinks"};
  return *kPatterns;
}

absl::StatusOr<ResolvedModel> ResolveModel(const v1::ModelManifest& manifest, const RankLayout& layout,
                                           const std::vector<std::string>& exclude_patterns) {
  if (manifest.tensors_size() == 0) {
    return absl::InvalidArgumentError("manifest: has no tensors");
  }
  auto excludes = ExcludeMatcher::Create(exclude_patterns);
  if (!excludes.ok()) return excludes.status();

  const int n = manifest.tensors_size();
  ResolvedModel model;
  model.tensors.resize(n);
  NameScanner names(*excludes);
  Placement placement;
  placement.layer.resize(n);
  placement.explicit_stage.resize(n);
  for (int i = 0; i < n; ++i) {
    const v1::TensorSpec& t = manifest.tensors(i);
    ResolvedTensor& r = model.tensors[i];
    absl::Status s = CheckTensor(t, i, &r);
    if (!s.ok()) return s;
    const bool classify = t.optimizer() == v1::OPTIMIZER_UNSPECIFIED;
    const NameScanner::Facts facts = names.Scan(t.name(), classify);
    if (facts.duplicate) return TensorError(t, i, "duplicate name");
    PlaceTensor(t, i, layout, facts, r, placement);
    s = ChooseOptimizer(t, i, classify && !facts.excluded, r);
    if (s.ok()) s = ResolveTpSplit(t, i, layout, r);
    if (s.ok()) s = ResolveNsBlocks(t, i, layout, r);
    if (!s.ok()) return s;
  }
  if (!placement.stage_error.ok()) return placement.stage_error;
  if (!placement.expert_error.ok()) return placement.expert_error;
  AssignStages(placement, layout.pp(), model.tensors);
  const int num_experts = placement.num_experts;
  if (layout.ep() > 1 && num_experts > 0 && num_experts % layout.ep() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest: ", num_experts, " experts are not divisible by ep ", layout.ep()));
  }

  model.muon_units.resize(layout.num_groups());
  model.adamw_units.resize(layout.num_groups());
  model.units.reserve(manifest.tensors_size());
  for (int i = 0; i < n; ++i) {
    absl::Status s = AddUnits(manifest.tensors(i), i, model.tensors[i], layout, num_experts, &model);
    if (!s.ok()) return s;
  }
  return model;
}

}  // namespace muonshard::planner
