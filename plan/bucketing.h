#ifndef MUONSHARD_PLAN_BUCKETING_H_
#define MUONSHARD_PLAN_BUCKETING_H_

#include <cstdint>
#include <vector>

#include "muonshard/v1/manifest.pb.h"

namespace muonshard::planner {

// Paddle's alignment unit for fused buffers, in bytes.
constexpr int64_t kAlignBytes = 256;

// Paddle `assign_group_by_size` (reducer.cc Eager_AssignGroupBySize): one open
// bucket per dtype, filled in input order; a bucket closes once its bytes
// reach `limit_bytes` (the item that crosses the limit is included). Buckets
// are returned ordered by their first item; each lists input positions.
std::vector<std::vector<int>> AssignGroupBySize(const std::vector<v1::DType>& dtypes,
                                                const std::vector<int64_t>& numels, int64_t limit_bytes);

// REDUCE buffers (`flatten_dense_tensors`): each tensor padded to a 256-byte
// boundary only.
int64_t ReducePaddedNumel(int64_t numel, int esize);

// REDUCE_SCATTER buffers (`build_reduce_scatter_buffer`): each tensor padded
// to a multiple of (256 / esize) * nranks elements, so every per-rank shard
// is a whole number of 256-byte blocks.
int64_t ReduceScatterPaddedNumel(int64_t numel, int esize, int nranks);

// Paddle's stable ordering of the 1-D path: by `str(dtype)`.
bool DTypeNameLess(v1::DType a, v1::DType b);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_BUCKETING_H_
