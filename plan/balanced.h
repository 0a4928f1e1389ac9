#ifndef MUONSHARD_PLAN_BALANCED_H_
#define MUONSHARD_PLAN_BALANCED_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "plan/model.h"
#include "plan/partition.h"
#include "plan/topology.h"

namespace muonshard::planner {

// Policy `balanced`. Per pipeline stage, every Muon matrix (each expert of a
// 3-D stack separately) is placed whole on one rank of its colour group so as
// to minimise the larger of the two normalised maxima
//     max_r F_r / F_mean   and   max_r M_r / M_mean,
// F_r = Newton-Schulz FLOPs of rank r, M_r = its Muon optimizer-state bytes,
// M_mean = (Muon + AdamW state bytes of the stage) / ranks, since AdamW
// shards are water-filled on top afterwards (WaterFill). Dense matrices may
// go to any rank of the stage, expert matrices only to their moe_sharding
// group, so dense placement complements each rank's expert load.
//
// Method: greedy in decreasing normalised size (F/F_mean + M/M_mean), each
// matrix to the eligible rank whose max(F/F_mean, M/M_mean) is lowest (or
// its previous owner when sticky and that stays within 2% of the mean), then
// bounded local search (moves and swaps off the worst rank). Experts of a
// stack are identical, so each stack's experts are finally relaid as
// contiguous ranges with the same per-rank counts.
// The load every rank carries from outside the plan being balanced, per
// global rank of its layout: Newton-Schulz FLOPs and optimizer-state bytes
// the balance (and the AdamW water-filling) levels around. Plans with tp > 1
// and ep > 1 plan the experts first and the replicas' dense part around them
// (tensor_parallel.h).
struct Preload {
  std::vector<double> ns_flops;
  std::vector<int64_t> state_bytes;
  // Per stage (empty = none): optimizer-state bytes a later AdamW
  // water-filling spreads over the stage's ranks around everything else
  // (the dense part's AdamW shards when the experts are planned first). They
  // count in the stage's mean, and level the bytes the balance leaves uneven.
  std::vector<double> stage_water_bytes;
};

struct BalancedOptions {
  int ns_steps = 5;
  bool per_dtype = false;
  // Sticky re-planning: previous owner (global rank) of each (tensor index,
  // matrix) of this manifest; null or empty for a from-scratch plan.
  const absl::flat_hash_map<std::pair<int, int>, int>* previous_owner = nullptr;
  // Null for none.
  const Preload* preload = nullptr;
  // Level optimizer-state bytes only (Newton-Schulz FLOPs ignored): the
  // memory-fit retry when the balanced plan does not fit its capacities.
  bool memory_only = false;
  // > 1 (tp > 1, on a replica's layout, tensor_parallel.h): the dense
  // matrices Newton-Schulz sees whole but a rank holds a shard of (TP-split),
  // sorted by NS FLOPs, are placed in runs of this many as one item each: a
  // replica that owns a run has its tp ranks orthogonalise one matrix each,
  // so the run costs its largest matrix's FLOPs per rank (and its shards'
  // bytes summed), and its shards' bytes sit on the ranks that run its NS.
  // Sticky, a run keeps a previous owner only when all its matrices had it.
  // PlanBuilder keeps it even where the seed policy's assignment scores
  // lower on AssignmentObjective, which counts every split matrix's whole
  // NS on the replica; the tp planner compares the merged plans instead.
  int dense_runs = 1;
};

std::vector<MuonShard> BalancedPartitionMuon(const ResolvedModel& model, const RankLayout& layout,
                                             const BalancedOptions& options);

// The balanced objective of an assignment, max over stages of
// max(max F / LB_F, max M / LB_M), with M after AdamW water-filling over the
// stage (estimated as one pool) and LB = max(stage mean, largest matrix).
// Lets the planner keep whichever of two assignments is better. `preload`
// (may be null) counts on every rank as in BalancedOptions.
double AssignmentObjective(const ResolvedModel& model, const RankLayout& layout, const std::vector<MuonShard>& shards,
                           int ns_steps, const Preload* preload = nullptr);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_BALANCED_H_
