#ifndef MUONSHARD_SIM_STEP_PROGRAM_H_
#define MUONSHARD_SIM_STEP_PROGRAM_H_

// A step program: what one optimizer step does on every rank, free of any
// cluster, as the simulator (sim/simulator.h) consumes it. muonshard's plan
// is one producer (sim/plan_program.h); a peer's strategy (Megatron's
// layer_sharded Muon, torchtitan's all-to-all, ZeRO-1 Muon, ...) is another
// list of the same ops over the same cost model (docs/simulator.md).
//
// An op is either a collective over a group of ranks (one op for all its
// members: it starts when every member is there) or compute on one rank.
// Ops run on lanes. A lane is a thread of execution: a rank's caller thread,
// its compute thread, or the lane thread of a communicator, which all the
// group's members run in one order (NOTE [Pipelined step] in
// worker/optimizer/sharded_optimizer.h). A lane holds blocks of ops; a
// block's ops run back to back (the lane takes nothing else in between, as
// the worker updates one bucket at a time). An in-order lane runs its blocks
// in the order given; an as-ready lane runs next whichever block can start
// first (ties: the one whose dependencies finished first), as the worker's
// updating thread takes buckets in the order they are reduced. An op on
// several lanes (a collective on the members' lanes in the sequential
// schedule, a TP gather on the members' compute lanes) occupies all of them
// at once. An op also waits for its `deps`.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace muonshard::sim {

enum class OpKind {
  // Collectives over `group` (sim/cost_model.h prices them).
  kReduce,
  kBroadcast,
  kReduceScatter,
  kAllGather,
  kAllReduce,
  kAllToAll,
  kGather,
  kScatter,
  // Compute on `rank`.
  kNewtonSchulz,  // `matrices`: GEMM-bound
  kElementwise,   // `memory_bytes`: bound by memory bandwidth
  kFixed,         // `seconds`, as given (e.g. a backward slice)
};
constexpr int kOpKindCount = 11;
bool IsCollective(OpKind kind);
// "reduce", "all_gather", "newton_schulz", ...
const char* OpKindName(OpKind kind);

// What an op's time is booked as in the per-rank breakdown.
enum class Phase {
  kReduce,            // gradients to their owners (reduce, reduce-scatter)
  kNewtonSchulz,      // orthogonalisation
  kMuonElementwise,   // Muon momentum and apply
  kAdamwElementwise,  // AdamW
  kSync,              // parameters back (broadcast, all-gather)
  kTpExchange,        // TP shards gathered to and scattered from the NS rank
  kOther,
};
constexpr int kPhaseCount = 7;
// "reduce", "ns", "muon", "adamw", "sync", "tp", "other".
const char* PhaseName(Phase phase);

// Newton-Schulz work of one call: `flops` (all its matrices) on `count`
// matrices of one shape whose smaller dimension is `min_dim` (they set the
// GEMM efficiency: NOTE [Batched NS cost] in sim/cluster.h).
struct NsMatrix {
  double flops = 0;
  int64_t min_dim = 1;
  int64_t count = 1;
};

// `calls` with every set of equal-shape calls (the same smaller dimension
// and FLOPs per matrix) merged into one batched call, in first-seen order:
// what code that batches its same-shape matrices runs (Megatron's
// --muon-ns-batch-size).
std::vector<NsMatrix> MergeSameShape(const std::vector<NsMatrix>& calls);

struct StepOp {
  OpKind kind = OpKind::kFixed;
  Phase phase = Phase::kOther;
  std::string label;  // for tables and pictures: "reduce M3", "ns M3"
  // Collectives: the group (index into StepProgram::groups), the root's
  // position in it for reduce / broadcast / gather / scatter, and the
  // buffer's size in bytes: what each member hands the collective (the
  // whole buffer; for gather / scatter the assembled one).
  int group = -1;
  int root = -1;
  int64_t bytes = 0;
  // Optional, one per member: the payload each member sends and receives
  // (TP gathers and scatters, whose shares differ). A gather or scatter with
  // them is priced by its root's link; both are booked as point-to-point
  // bytes instead of `bytes`.
  std::vector<int64_t> member_send;
  std::vector<int64_t> member_recv;
  // Gathers and scatters with member bytes that the code issues as one
  // group call (Communicator::GroupStart / GroupEnd) share an id >= 0, and
  // sit next to each other on their lanes: an NCCL cluster runs them at once
  // (priced together on the group's first op, the others take no time);
  // Gloo runs them one after another, each priced alone. -1: none.
  int call_group = -1;
  // Compute: the rank, and the work of its kind.
  int rank = -1;
  std::vector<NsMatrix> matrices;
  int64_t memory_bytes = 0;
  int calls = 1;  // kElementwise: kernel calls, each kernel_launch_us
  double seconds = 0;
  // Ops that must end before this one starts (indices into ops).
  std::vector<int> deps;
};

enum class LaneOrder { kInOrder, kAsReady };

struct Lane {
  std::string name;        // "compute", "comm g0", "rank 3"
  std::vector<int> ranks;  // the ranks whose timeline shows the lane
  LaneOrder order = LaneOrder::kInOrder;
  std::vector<std::vector<int>> blocks;  // op indices
};

struct StepProgram {
  std::string name;  // "muonshard pipelined"
  int world_size = 0;
  // The plan's Topology.gpus_per_node (0: not known). Gloo workers run a
  // group that forms a grid over these nodes inside each node first (NOTE
  // [Node-local collectives] in plan/node_grid.h), any other flat.
  int gpus_per_node = 0;
  std::vector<std::vector<int>> groups;  // global ranks, in group-rank order
  std::vector<Lane> lanes;
  std::vector<StepOp> ops;

  // Appends `op`; returns its index.
  int AddOp(StepOp op);
  // Appends a lane; returns its index.
  int AddLane(Lane lane);
  // `op` at the end of `lane`: in a new block, or in its last block.
  void Append(int lane, int op, bool new_block);
};

// The program is well formed: indices in range, every op on at least one
// lane and at most once per lane, sizes and work non-negative, member
// vectors one per member. INVALID_ARGUMENT naming the op, lane or group.
// (A program whose lanes wait on each other in a cycle passes; the
// simulator reports it.)
absl::Status ValidateProgram(const StepProgram& program);

}  // namespace muonshard::sim

#endif  // MUONSHARD_SIM_STEP_PROGRAM_H_
