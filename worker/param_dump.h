#ifndef MUONSHARD_WORKER_PARAM_DUMP_H_
#define MUONSHARD_WORKER_PARAM_DUMP_H_

// `--dump-params FILE` across processes. With pp > 1 or ep > 1 no rank holds
// every tensor, so a dump is written in two steps:
//   1. After GatherMasters(), the lowest rank of each comm group writes the
//      tensor parts of that group it holds to FILE.rank-N (N = its rank):
//      a whole tensor under its name and shape, a part of a fused expert
//      stack under "NAME@BEGIN-END" (flat, its element range), a TP shard
//      (tp > 1) under "NAME@tpT:BEGIN-END" (a range of shard T); with
//      tp > 1 a replicated tensor is written by tp rank 0's group only.
//   2. Once every rank has written (a rendezvous barrier), rank 0 merges the
//      part files into FILE — every tensor of the plan, whole, fp32 — and
//      deletes them. The parts must be visible to rank 0: one host, or a
//      shared file system. Every element is written by exactly one rank, so
//      a part file left over from another run makes the merge fail (an
//      element written twice, or a tensor not in the plan) rather than mix
//      runs silently.
// The reference run writes FILE directly (ReferenceParams; of a tp plan it
// runs planner::WholeModelRequest's plan). Both carry the
// same metadata keys, so muonshard-compare-params compares every tensor.
//
// Pure functions apart from the part-file helpers' I/O.

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "muonshard/v1/plan.pb.h"
#include "worker/optimizer/gradient_source.h"
#include "worker/optimizer/reference_optimizer.h"
#include "worker/params_file.h"

namespace muonshard::worker {

// FILE.rank-N.
std::string PartFilePath(const std::string& path, int rank);

// Whether `rank` writes a part file: it is the lowest rank of a group it
// holds tensor parts of.
bool WritesParts(const v1::RankView& view, const std::vector<HeldTensor>& held);

// The parts `view.rank()` writes (see above): each held part whose group's
// lowest rank is this rank, with its gathered master values (`masters`, by
// plan tensor index, as ShardedOptimizer::GatherMasters returns them).
// INVALID_ARGUMENT when a part's master is missing or of the wrong size.
absl::StatusOr<ParamsFile> RankParts(const v1::RankView& view, const std::vector<HeldTensor>& held,
                                     const std::map<int, std::vector<float>>& masters);

// Every tensor of `plan`, whole, assembled from part files (any number, any
// order). INVALID_ARGUMENT naming the tensor when a part is missing,
// overlaps another or does not fit the tensor.
absl::StatusOr<ParamsFile> MergeParts(const v1::Plan& plan, absl::Span<const ParamsFile> parts);

// Every tensor of the reference optimizer's plan: its fp32 masters.
ParamsFile ReferenceParams(const v1::Plan& plan, const ReferenceOptimizer& reference);

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_PARAM_DUMP_H_
