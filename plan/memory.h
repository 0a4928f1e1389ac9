#ifndef MUONSHARD_PLAN_MEMORY_H_
#define MUONSHARD_PLAN_MEMORY_H_

// Whole training memory per rank (docs/planner.md, "Memory"): what a rank's
// step holds as ShardedOptimizer allocates it, term by term, derived from the
// plan alone, and the fit check against Topology.device_memory_bytes.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// The canonical capacities of `topology` for `world_size` ranks: empty, or
// one value when every rank has the same. INVALID_ARGUMENT (naming
// topology.device_memory_bytes) for a count other than 0, 1 or world_size,
// or a value <= 0.
absl::StatusOr<std::vector<int64_t>> CanonicalCapacities(const v1::Topology& topology, int world_size);

// The capacity of `rank` under canonical `capacities` (0 = not given, or
// no value for it).
int64_t CapacityOf(const std::vector<int64_t>& capacities, int rank);

// RankPlan.memory of every rank (by position in plan.ranks, which is the
// rank) as the plan implies it.
std::vector<v1::RankMemory> ComputeRankMemory(const v1::Plan& plan);

// Fills every RankPlan.memory from the plan's buckets, owned tensors and
// topology.device_memory_bytes, and the PlanStats memory fields.
void AddMemory(v1::Plan& plan);

// OK when no capacity is given or every rank fits; else INVALID_ARGUMENT
// naming the rank with the least headroom, its need, its capacity and its
// largest term, e.g. "topology.device_memory_bytes: rank 3 needs 91.2 GiB,
// 11.2 GiB over its 80.0 GiB (largest term: adamw_moment 40.0 GiB); 2 of 8
// ranks do not fit".
absl::Status CheckFit(const v1::Plan& plan);

// True when `status` is CheckFit's refusal.
bool IsFitError(const absl::Status& status);

// "80.0 GiB"-style rendering (binary units, one decimal).
std::string FormatBytes(double bytes);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_MEMORY_H_
