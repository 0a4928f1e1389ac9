#include "plan/tp_mesh.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace muonshard::planner {
namespace {

bool IsSplit(v1::TpSplit s) { return s == v1::TP_COLUMN || s == v1::TP_ROW; }

// The tensor dimension each mesh dimension divides, -1 where it replicates.
std::vector<int> SplitDims(int dims, v1::Layout layout, absl::Span<const v1::TpSplit> splits) {
  std::vector<int> out;
  out.reserve(splits.size());
  for (v1::TpSplit s : splits) out.push_back(IsSplit(s) ? TpSplitDim(dims, layout, s) : -1);
  return out;
}

}  // namespace

std::vector<int> TpMeshOf(const v1::Topology& topology) {
  if (topology.tp_mesh_size() > 0) return {topology.tp_mesh().begin(), topology.tp_mesh().end()};
  return {std::max(1, topology.tp())};
}

std::vector<v1::TpSplit> MeshSplitOf(const google::protobuf::RepeatedField<int>& mesh_split, v1::TpSplit tp_split) {
  if (mesh_split.empty()) return {tp_split};
  std::vector<v1::TpSplit> out;
  out.reserve(mesh_split.size());
  for (int s : mesh_split) out.push_back(static_cast<v1::TpSplit>(s));
  return out;
}

bool AnyMeshSplit(absl::Span<const v1::TpSplit> splits) { return std::any_of(splits.begin(), splits.end(), IsSplit); }

absl::Status CheckTpTiles(absl::Span<const int64_t> shape, v1::Layout layout, absl::Span<const int> mesh,
                          absl::Span<const v1::TpSplit> splits) {
  if (splits.size() != mesh.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_mesh_split has ", splits.size(), " values but the tp mesh has ", mesh.size(), " dimensions"));
  }
  const int dims = static_cast<int>(shape.size());
  for (v1::TpSplit s : splits) {
    if (!v1::TpSplit_IsValid(s)) return absl::InvalidArgumentError(absl::StrCat("unknown tp split ", s));
    if (s == v1::TP_ROW && dims < 2) {
      return absl::InvalidArgumentError(
          "TP_ROW needs a tensor of 2 or more dimensions (a 1-D tensor splits along out)");
    }
  }
  const std::vector<int> split_dims = SplitDims(dims, layout, splits);
  std::vector<int64_t> blocks(dims, 1);
  for (size_t m = 0; m < mesh.size(); ++m) {
    if (split_dims[m] >= 0) blocks[split_dims[m]] *= mesh[m];
  }
  int divided = 0;
  for (int x = 0; x < dims; ++x) {
    if (blocks[x] == 1) continue;
    ++divided;
    if (shape[x] % blocks[x] != 0) {
      return absl::InvalidArgumentError(absl::StrCat("dimension ", x, " (", shape[x], ") is not divisible by the ",
                                                     blocks[x], " tp mesh ranks that split it"));
    }
  }
  if (divided > 1 && dims != 2) {
    return absl::InvalidArgumentError(absl::StrCat("a tile split along ", divided, " dimensions of a ", dims,
                                                   "-D tensor: only 2-D matrices are tiled"));
  }
  return absl::OkStatus();
}

TpTile TpTileOf(absl::Span<const int64_t> shape, v1::Layout layout, absl::Span<const int> mesh,
                absl::Span<const v1::TpSplit> splits, int k) {
  const int dims = static_cast<int>(shape.size());
  std::vector<int> coordinate(mesh.size());
  for (int m = static_cast<int>(mesh.size()) - 1; m >= 0; --m) {
    coordinate[m] = k % mesh[m];
    k /= mesh[m];
  }
  const std::vector<int> split_dims = SplitDims(dims, layout, splits);
  std::vector<int64_t> blocks(dims, 1), index(dims, 0);
  for (int m = static_cast<int>(mesh.size()) - 1; m >= 0; --m) {  // the last mesh dimension is the major one
    const int x = split_dims[m];
    if (x < 0) continue;
    index[x] = index[x] * mesh[m] + coordinate[m];
    blocks[x] *= mesh[m];
  }
  TpTile tile;
  for (int x = 0; x < dims; ++x) {
    tile.shape.push_back(shape[x] / blocks[x]);
    tile.offset.push_back(index[x] * tile.shape.back());
  }
  return tile;
}

TpShardRuns RunsOfTile(absl::Span<const int64_t> whole_shape, const TpTile& tile) {
  const int dims = static_cast<int>(whole_shape.size());
  int first = dims, last = -1;  // the first and last divided dimensions
  for (int x = 0; x < dims; ++x) {
    if (tile.shape[x] == whole_shape[x]) continue;
    first = std::min(first, x);
    last = x;
  }
  TpShardRuns r;
  if (last < 0) {  // the whole tensor
    int64_t numel = 1;
    for (int64_t d : whole_shape) numel *= d;
    r.runs = 1;
    r.run = r.pitch = numel;
    return r;
  }
  if (first == last) {  // one divided dimension: TpShardRunsOf's runs
    int64_t outer = 1, inner = 1;
    for (int x = 0; x < first; ++x) outer *= whole_shape[x];
    for (int x = first + 1; x < dims; ++x) inner *= whole_shape[x];
    r.runs = outer;
    r.run = tile.shape[first] * inner;
    r.pitch = whole_shape[first] * inner;
    r.offset = tile.offset[first] * inner;
    return r;
  }
  // A tile of a 2-D matrix: its rows, each a run of its columns.
  r.runs = tile.shape[0];
  r.run = tile.shape[1];
  r.pitch = whole_shape[1];
  r.offset = tile.offset[0] * whole_shape[1] + tile.offset[1];
  return r;
}

TpTile TpTileOf(const v1::PlannedTensor& tensor, const v1::Topology& topology, int k) {
  return TpTileOf(tensor, TpMeshOf(topology), k);
}

TpTile TpTileOf(const v1::PlannedTensor& tensor, absl::Span<const int> mesh, int k) {
  const std::vector<v1::TpSplit> splits = MeshSplitOf(tensor.tp_mesh_split(), tensor.tp_split());
  return TpTileOf(tensor.shape(), tensor.layout(), mesh, splits, k);
}

}  // namespace muonshard::planner
