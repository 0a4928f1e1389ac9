#ifndef MUONSHARD_PLAN_PARTITION_H_
#define MUONSHARD_PLAN_PARTITION_H_

#include <cstdint>
#include <vector>

#include "muonshard/v1/manifest.pb.h"
#include "plan/model.h"
#include "plan/topology.h"

namespace muonshard::planner {

// Matrices [matrix_begin, matrix_end) of a Muon unit, owned whole by one rank.
struct MuonShard {
  int unit = 0;
  int matrix_begin = 0;
  int matrix_end = 1;
  int owner = 0;  // group rank
};

// Per group rank [begin, end) boundaries of one AdamW bucket's buffer.
using ShardOffsets = std::vector<int64_t>;

// Paddle `_partition_2d_parameters`: stable sort by numel descending, then
// each tensor to the first least-loaded of the first `active` ranks, with
// active = min(max(1, int(sum(numel) * 4 / 2^20 / buffer_mb) + 1), group_size)
// (`all_ranks`: active = group_size, the older seed). Returns the owner group
// rank of each input.
std::vector<int> SeedGreedy(const std::vector<int64_t>& numels, int group_size, int64_t buffer_mb, bool all_ranks);

// The seed policies over every group: per group, Muon units in manifest order
// (per dtype in `str(dtype)` order with fresh loads when `per_dtype`).
std::vector<MuonShard> SeedPartitionMuon(const ResolvedModel& model, const RankLayout& layout, int64_t buffer_mb,
                                         bool all_ranks, bool per_dtype);

// Equal shards: rank i of n owns [i * total / n, (i + 1) * total / n).
ShardOffsets EvenShards(int64_t total, int n);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_PARTITION_H_
