#ifndef MUONSHARD_SIM_PLAN_PROGRAM_H_
#define MUONSHARD_SIM_PLAN_PROGRAM_H_

// muonshard's optimizer step, from its plan, as a step program
// (sim/step_program.h): what ShardedOptimizer runs (worker/optimizer/
// sharded_optimizer.h), op for op.
//
//   Muon bucket b of group g   reduce to the owner (numel x grad dtype
//                              bytes); on the owner: the element-wise
//                              momentum and apply, Newton-Schulz of its
//                              owned matrices (their ns_flops, in the
//                              worker's batched calls: NOTE [Batched NS
//                              cost] in sim/cluster.h), with
//                              tp > 1 the TP gathers and scatters of the
//                              split matrices around it (one per NS rank of
//                              the bucket, per-member bytes from the owned
//                              tensors' tp_send / tp_recv bytes; an
//                              all-gather in the duplicated mode); broadcast
//                              from the owner (numel x dtype bytes).
//   AdamW bucket b of group g  reduce-scatter; on every member the update
//                              of its shard; all-gather.
// Element-wise memory traffic per element: MuonBytesPerElement /
// AdamwBytesPerElement. Groups of one rank communicate nothing.
//
// Sequential: one in-order lane per rank, as the caller's thread runs the
// step: the reduces of its groups (ascending group, each group's Muon then
// AdamW buckets), every owned Muon bucket's update (the buckets with TP
// exchanges round by round, NOTE [TP exchange rounds], then the others
// ascending: one block, their NS calls batched across them in batches of at
// most `muon_batch_mib`, NOTE [Muon batches] in plan/ns_batches.h; with 0 a
// block per bucket), every AdamW shard's, then the broadcasts and
// all-gathers in the reduces' order.
// A collective occupies its members' lanes.
//
// Pipelined (NOTE [Pipelined step]): one in-order comm lane per group of two
// or more ranks, shared by its members, running the group's reduces in the
// hand-off order (descending last tensor index; ties: Muon before AdamW,
// then position), then its broadcasts and all-gathers in the same order,
// each once its update is done (the owner's; every member's for AdamW).
// One as-ready compute lane per rank: each bucket's update is a block that
// starts once the bucket is reduced; buckets with TP exchanges go round by
// round, a round one block that starts once its buckets are reduced and the
// round before it is done, on every rank of the TP group
// (TpMuonExchange::rounds()).
//
// Pure.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/ns_batches.h"
#include "sim/step_program.h"

namespace muonshard::sim {

enum class Schedule { kSequential, kPipelined };
const char* ScheduleName(Schedule schedule);  // "sequential", "pipelined"
absl::StatusOr<Schedule> ParseSchedule(absl::string_view name);

// How a rank's owned Muon tensors of a bucket become Newton-Schulz calls:
// kWorker as muonshard's worker batches them (NOTE [Batched Muon]); kPerTensor
// one call per owned tensor at the per-matrix efficiency, as code that loops
// over its parameters does (Paddle's seed: BuildPaddleSeedProgram).
enum class NsCalls { kWorker, kPerTensor };

// `muon_batch_mib`: the worker's StepOptions::muon_batch_mib (its
// --muon-batch-mib), which the sequential schedule's batches follow.
// INVALID_ARGUMENT on a plan whose references do not resolve (a bucket's
// group, an owned tensor's bucket), naming them; or whose TP group's ranks
// exchange in different numbers of buckets.
absl::StatusOr<StepProgram> BuildPlanProgram(const v1::Plan& plan, Schedule schedule,
                                             NsCalls ns_calls = NsCalls::kWorker,
                                             int64_t muon_batch_mib = planner::kDefaultMuonBatchMib);

// Bytes an update reads and writes per element: the gradient; Muon the
// fp32 momentum (read, write) and update (write, read back by the apply);
// AdamW the two fp32 moments (read, write each); both the fp32 master (read,
// write) and, for a 16-bit parameter, the model copy it is cast into.
int64_t MuonBytesPerElement(v1::DType param, v1::DType grad);
int64_t AdamwBytesPerElement(v1::DType param, v1::DType grad);

}  // namespace muonshard::sim

#endif  // MUONSHARD_SIM_PLAN_PROGRAM_H_
