#ifndef MUONSHARD_PLAN_MEMORY_H_
#define MUONSHARD_PLAN_MEMORY_H_

// Whole training memory per rank (docs/planner.md, "Memory"): what a rank's
// step holds as ShardedOptimizer allocates it, term by term, derived from the
// plan alone. The memory stage of the plan pipeline (planner.h): a plan in,
// the plan with every rank's memory out (AddMemory); the check against
// Topology.device_memory_bytes is the fit stage's (fit.h).

#include <cstdint>
#include <vector>

#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::planner {

// The terms of v1::RankMemory in field order, with their names in messages
// and metric labels ("model", "grad", ..., "ns_workspace").
struct MemoryTerm {
  const char* name;
  int64_t (v1::RankMemory::*get)() const;
};
const std::vector<MemoryTerm>& MemoryTerms();

// Newton-Schulz workspace of one rows x cols matrix, fp32: the update, two
// iterates and two Gram-sized products (kernels/newton_schulz_cpu.cc, and
// NsWorkspaceBytes in kernels/internal/cuda_newton_schulz.cc for one matrix).
int64_t NsWorkspaceBytes(int64_t rows, int64_t cols);

// The capacity of `rank` under canonical `capacities` (CanonicalCapacities,
// canonical.h; 0 = not given, or no value for it).
int64_t CapacityOf(const std::vector<int64_t>& capacities, int rank);

// RankPlan.memory of every rank (by position in plan.ranks, which is the
// rank) as the plan implies it.
std::vector<v1::RankMemory> ComputeRankMemory(const v1::Plan& plan);

// Fills every RankPlan.memory from the plan's buckets, owned tensors and
// topology.device_memory_bytes, and the PlanStats memory fields.
void AddMemory(v1::Plan& plan);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_MEMORY_H_
