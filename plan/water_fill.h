#ifndef MUONSHARD_PLAN_WATER_FILL_H_
#define MUONSHARD_PLAN_WATER_FILL_H_

// AdamW's element-wise shards: each group's fused buffers cut so that every
// rank ends at the same optimizer-state level over what it already holds
// (its Muon matrices), at aligned positions. Used by PlanBuilder after the
// Muon partition (seed or balanced).

#include <cstdint>
#include <vector>

#include "plan/partition.h"

namespace muonshard::planner {

// Water-filling of one group's AdamW buffers. `bucket_numels` are the group's
// buckets (elements, each a multiple of its `bucket_align` elements);
// `bucket_state_bytes` their optimizer-state bytes per element
// (AdamwStateBytesPerElem of the bucket's dtype); `base_bytes[i]` the
// optimizer-state bytes group rank i already holds. Finds the level L with
// sum_i max(0, L - base_i) = the buckets' state bytes and cuts the
// concatenated buffers into contiguous per-rank ranges of those bytes, at
// aligned positions. Returns each bucket's shard offsets (group size + 1);
// adds what it assigns to `base_bytes`.
std::vector<ShardOffsets> WaterFill(const std::vector<int64_t>& bucket_numels, const std::vector<int64_t>& bucket_align,
                                    const std::vector<int64_t>& bucket_state_bytes, std::vector<int64_t>& base_bytes);

// The water level L with sum_i max(0, L - base_i) = water.
double WaterLevel(const std::vector<int64_t>& base, double water);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_WATER_FILL_H_
