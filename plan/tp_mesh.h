#ifndef MUONSHARD_PLAN_TP_MESH_H_
#define MUONSHARD_PLAN_TP_MESH_H_

// NOTE [TP mesh tiles]
// The tensor-parallel group of a plan may be a mesh (Topology.tp_mesh, e.g.
// a DTensor model on a 2-D FSDP x TP DeviceMesh planned as one replica of
// tp = W): tp rank k is the row-major coordinate c of k on the mesh, and a
// tensor says per mesh dimension how it is split there
// (TensorSpec.tp_mesh_split, the TpSplit vocabulary: COLUMN divides its out
// dimension, ROW its in dimension, REPLICATED nothing). So rank k holds a
// tile: per tensor dimension x, the mesh dimensions m_1 < .. < m_j that
// divide x cut it into prod(mesh[m_i]) equal blocks, and rank k holds block
//   c[m_j] * (mesh[m_1] ... mesh[m_j-1]) + ... + c[m_1]
// (the last mesh dimension the major one: FSDP2 over tensor parallelism,
// whose (_StridedShard(0), Shard(0)) gives rank (d, t) of a D x T mesh row
// block t * D + d). Ranks that replicate a tile hold the same block. Tiles
// are even (every split dimension divisible) and either split one tensor
// dimension or are tiles of a 2-D matrix, so a tile is TpShardRuns (model.h).
// These functions are the one definition of a tile's place, for the
// planner (local shapes), the worker's gather/scatter and the Python check.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "google/protobuf/repeated_field.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/model.h"

namespace muonshard::planner {

// The tp group's mesh: topology.tp_mesh, or {tp} (tp 0 = 1) when empty.
std::vector<int> TpMeshOf(const v1::Topology& topology);

// A tensor's split per mesh dimension: `mesh_split`, or {tp_split} when empty.
std::vector<v1::TpSplit> MeshSplitOf(const google::protobuf::RepeatedField<int>& mesh_split, v1::TpSplit tp_split);

// Whether any mesh dimension divides the tensor (COLUMN or ROW).
bool AnyMeshSplit(absl::Span<const v1::TpSplit> splits);

// The tile tp rank k holds: per tensor dimension, its offset and length.
struct TpTile {
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
};

// OK when `splits` tiles a tensor of `shape` and `layout` evenly on `mesh`:
// one split per mesh dimension, known values, ROW on 2 or more dimensions,
// every split dimension divisible by its mesh dimensions, and two split
// tensor dimensions only on a 2-D matrix. INVALID_ARGUMENT says why (the
// caller names the tensor).
absl::Status CheckTpTiles(absl::Span<const int64_t> shape, v1::Layout layout, absl::Span<const int> mesh,
                          absl::Span<const v1::TpSplit> splits);

// REQUIRES: CheckTpTiles(shape, layout, mesh, splits) is OK, 0 <= k < prod(mesh).
TpTile TpTileOf(absl::Span<const int64_t> shape, v1::Layout layout, absl::Span<const int> mesh,
                absl::Span<const v1::TpSplit> splits, int k);

// The tile as runs of the whole tensor (row-major).
// REQUIRES: `tile` is TpTileOf a tensor of `whole_shape`.
TpShardRuns RunsOfTile(absl::Span<const int64_t> whole_shape, const TpTile& tile);

// Tp rank k's tile of a planned tensor of a plan with `topology` (or its
// TpMeshOf `mesh`). REQUIRES: IsTpSplit(tensor).
TpTile TpTileOf(const v1::PlannedTensor& tensor, const v1::Topology& topology, int k);
TpTile TpTileOf(const v1::PlannedTensor& tensor, absl::Span<const int> mesh, int k);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_TP_MESH_H_
