#ifndef MUONSHARD_CHECKPOINT_STATE_H_
#define MUONSHARD_CHECKPOINT_STATE_H_

// The seam between the worker and the checkpoint library: a rank's optimizer
// state as a list of fp32 shards, each one (tensor, state kind, flattened
// element range) of the plan, pointing at memory the caller owns, plus the
// scalars taken once per checkpoint.
//
// ExpectedShards() lists what a rank of a plan owns, so the worker can point
// shards at its buffers (Muon: the master and momentum of each owned shard;
// AdamW: the master and two moments of each slice's real elements, never the
// alignment padding) and tests can fill synthetic state. Pure; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "muonshard/v1/checkpoint.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::checkpoint {

enum class StateKind { kMaster, kMomentum, kMoment1, kMoment2 };

// "master", "momentum", "moment1", "moment2" (the structured key segment).
absl::string_view StateKindName(StateKind kind);
v1::StateKind ToProto(StateKind kind);
// INVALID_ARGUMENT for STATE_KIND_UNSPECIFIED and unknown values.
absl::StatusOr<StateKind> FromProto(v1::StateKind kind);

// The kinds a tensor of `optimizer` keeps, in save order.
std::vector<StateKind> KindsOf(v1::Optimizer optimizer);

// UNIMPLEMENTED naming `tensor` when it is tiled over a multi-dimensional tp
// mesh (PlannedTensor.tp_mesh_split; NOTE [TP mesh tiles] in
// plan/tp_mesh.h): this format stores a TP shard as one block of one split
// dimension (CheckpointTensor.tp_dim), so such a plan saves and loads its
// optimizer state through torch.distributed.checkpoint instead.
absl::Status CheckFormatHolds(const v1::PlannedTensor& tensor);

// One (tensor, kind, [begin, end)) of a plan.
struct ShardSpec {
  int tensor = -1;                          // index into Plan.tensors
  std::string name;                         // Plan.tensors[tensor].name
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;  // the model's (state is fp32); spells Paddle keys
  StateKind kind = StateKind::kMaster;
  int64_t begin = 0;  // flattened element range of the tensor
  int64_t end = 0;
  // Elements of the whole tensor; when set, a checkpoint holding the tensor
  // with another size is refused (a reshaped tensor of the same name).
  int64_t tensor_numel = 0;
  // A TP-split tensor of a plan with tp > 1: [begin, end) is a range of
  // shard tp_rank, the tp_rank-th of tp blocks along dimension tp_dim of the
  // whole tensor of `shape` (planner::TpShardRunsOf). tp is 1 otherwise.
  int tp = 1;
  int tp_rank = 0;
  int tp_dim = -1;
  std::vector<int64_t> shape;
  // A tensor replicated over the TP group (not split, not an expert of a
  // moe_sharding group, which one tp rank holds) with tp > 1: the rank's tp
  // rank. Every copy loads; only copy 0 is saved (WriteRankFile skips the
  // others), as the copies are equal.
  int tp_copy = 0;
  int64_t numel() const { return end - begin; }
  // The whole tensor's flattened index of element begin + i.
  int64_t WholeIndex(int64_t i) const;
};

// A shard and the caller's memory holding it (numel() floats). The memory
// must outlive every call the shard is passed to.
struct StateShard {
  ShardSpec spec;
  absl::Span<float> data;
};

// Taken once per checkpoint (see v1::CheckpointScalars).
struct Scalars {
  int64_t step = 0;
  float beta1_pow = 1.0f;
  float beta2_pow = 1.0f;
};

// The shards `rank` of `plan` owns: for each owned Muon tensor (or matrix
// range of a stack) its MASTER and MOMENTUM, then for each AdamW slice its
// MASTER, MOMENT1 and MOMENT2, in the rank plan's order. With tp > 1 the
// ranges of a TP-split tensor are of the rank's shard (ShardSpec::tp). INVALID_ARGUMENT
// when the rank is outside the plan or refers to a tensor that is not there.
absl::StatusOr<std::vector<ShardSpec>> ExpectedShards(const v1::Plan& plan, int rank);

// The same from a rank's view of the plan (what a worker holds).
absl::StatusOr<std::vector<ShardSpec>> ExpectedShards(const v1::RankView& view);

// Where the real elements of one of a rank's AdamW slices sit in its shard
// of the slice's bucket. A worker keeping one fp32 buffer per bucket shard
// (padding included, as Paddle and the sharded optimizer do) points the
// slice's StateShards at [shard_offset, shard_offset + slice numel) of the
// master / moment buffers of that bucket.
struct SliceLocation {
  int bucket = 0;            // AdamwBucket.id
  int64_t shard_offset = 0;  // elements from the start of this rank's shard
};

// Parallel to view.rank().slices(). INVALID_ARGUMENT naming the slice's
// tensor when its bucket, entry or group is not in the view, or it does not
// lie inside this rank's shard of the bucket.
absl::StatusOr<std::vector<SliceLocation>> LocateSlices(const v1::RankView& view);

// Elements of state in `specs`.
int64_t TotalNumel(absl::Span<const ShardSpec> specs);

}  // namespace muonshard::checkpoint

#endif  // MUONSHARD_CHECKPOINT_STATE_H_
