#ifndef MUONSHARD_PLAN_NODE_GRID_H_
#define MUONSHARD_PLAN_NODE_GRID_H_

// NOTE [Node-local collectives]
// With Topology.gpus_per_node = g, rank r is on node r / g. A comm group
// whose ranks lie on k >= 2 nodes with the same number m >= 2 of them on
// each is a k x m grid: grid[i][l] is the group rank of the l-th of the
// group's ranks (in group-rank order) on the i-th of its nodes (in node
// order). Its collectives go in two levels, each over one row ("local": the
// m ranks of a node, fast links) or one column ("cross": the k ranks with
// the same local index l, one per node, the links between nodes):
//   Reduce(root R at (i, l))   local Reduce to (., l) on every node, then
//                              cross Reduce in column l to node i (Gloo's
//                              reduce of two ranks is one send);
//   Broadcast(root (i, l))     cross Broadcast in column l from node i, then
//                              local Broadcast from (., l) on every node;
//   ReduceScatter(counts)      local ReduceScatter of the buffer regrouped by
//                              local index (part l: the segments of column l,
//                              node by node), then cross ReduceScatter of part
//                              l into the segments of column l;
//   AllGather(counts)          the reverse: cross, then local;
//   AllReduce                  local Reduce to l = 0, cross AllReduce in
//                              column 0, local Broadcast from l = 0.
// Between two nodes only one copy of each reduced or broadcast byte crosses
// where a ring over all ranks in rank order crosses each node boundary with
// all of them. Reductions and broadcasts go through the root's column alone:
// CPU nodes have one NIC that every column would share (NCCL spreads a GPU
// node's rails itself). Any other group
// (one node, one rank per node, or uneven) has no grid and runs flat, as
// when gpus_per_node is 0 (not known). The worker builds the levels
// (worker/comm/hierarchical_communicator.h); the simulator costs them.

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace muonshard::planner {

// grid[i][l] = group rank, as above; empty when the group runs flat.
// `ranks` are the group's global ranks in group-rank order; gpus_per_node
// 0 (not known) or 1 gives an empty grid.
std::vector<std::vector<int>> NodeGridOf(absl::Span<const int32_t> ranks, int gpus_per_node);

// NOTE [Expert owners across nodes]
// The ep expert groups of a stage (MOE_EXPERT, one per ep rank) hold the
// same shapes and reduce and broadcast their buckets at the same time, each
// bucket into (out of) its owner's node. Laid out in group-rank order, every
// group's k-th bucket has its owner on the same node, so the groups' k-th
// reduces all cross into one node at once, taking turns on its link's way
// in while the other ways idle (one link per node, as CPU nodes have). When
// the plan knows its nodes, the planner starts each expert group's owners at
// another node: group ep_rank e emits its buckets (the sequential step's
// order) from the first of its ranks on the (e mod k)-th of its k nodes,
// round the group's ranks, and the balanced policy breaks its load ties
// and lays out its stacks' expert ranges in that order too, so the bucket
// holding a group's latest experts (the pipelined step reduces buckets as
// backward hands them over) is owned on another node in each group. The
// loads are what they were, on the same or other ranks of the group; the
// bytes are the same.
//
// That first position, in group-rank order: 0 when gpus_per_node is 0 (not
// known) or 1 (no two ranks share a node's link), for ep rank 0, or when the
// group's ranks lie on one node.
int ExpertOwnerRotation(absl::Span<const int32_t> ranks, int gpus_per_node, int ep_rank);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_NODE_GRID_H_
