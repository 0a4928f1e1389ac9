#ifndef MUONSHARD_WORKER_OPTIMIZER_STEP_STATS_H_
#define MUONSHARD_WORKER_OPTIMIZER_STEP_STATS_H_

// What one sharded optimizer step cost on one rank: wall time per phase and
// the bytes handed to each kind of collective, counted as the plan counts
// them (RankPlan.grad_reduce_bytes etc.; see counting_communicator.h). A
// metrics exporter turns these into muonshard_* series.

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace muonshard::worker {

struct StepCommBytes {
  int64_t grad_reduce = 0;          // Muon gradients, Reduce to the owners
  int64_t grad_reduce_scatter = 0;  // AdamW gradients and Muon scatter rounds, ReduceScatter
  int64_t param_broadcast = 0;      // Muon parameters, Broadcast from owners
  int64_t param_all_gather = 0;     // AdamW parameters and Muon scatter rounds, AllGather
  // Tensor-parallel Muon (TENSOR_PARALLEL groups): bytes this rank sends
  // plus receives in the gathers, scatters and all-gathers of the NS
  // inputs and results and the all-reduces of sharded Newton-Schulz (ring
  // wire bytes), the plan's tp_send_bytes + tp_recv_bytes.
  int64_t tp = 0;
  int64_t collectives = 0;  // calls of any kind

  int64_t total() const { return grad_reduce + grad_reduce_scatter + param_broadcast + param_all_gather + tp; }
  bool operator==(const StepCommBytes& o) const {
    return grad_reduce == o.grad_reduce && grad_reduce_scatter == o.grad_reduce_scatter &&
           param_broadcast == o.param_broadcast && param_all_gather == o.param_all_gather && tp == o.tp &&
           collectives == o.collectives;
  }
};

// NOTE [Step trace]
// With StepOptions::trace the optimizer records when each bucket's work ran
// in a step, so that what overlaps can be seen (bench/worker/shaped_net.py
// --trace, muonshard-worker --step-trace-dir: Chrome trace-event JSON for
// chrome://tracing or Perfetto). One span per bucket and kind: its Reduce or
// ReduceScatter, its update (Muon on an owned bucket, TP exchanges included:
// a round's, NOTE [TP exchange rounds], in its first bucket's span; the
// sequential schedule's batches across buckets, NOTE [Muon batches], in the
// first updated bucket's; AdamW on the rank's shard) and its Broadcast or
// AllGather. Times are the
// host's, in nanoseconds from the step's start: on device backends, whose
// calls only enqueue, a span is the enqueueing, not the device's work.
struct StepSpan {
  enum class Kind { kReduce, kUpdate, kSync };
  Kind kind = Kind::kReduce;
  bool muon = true;  // a Muon bucket (or piece, NOTE [Step pieces]), else AdamW
  int bucket = 0;    // index among the view's Muon / AdamW buckets
  // The thread it ran on: kCallerThread (the sequential schedule's
  // everything, the pipelined one's updates), else the communication lane
  // (one per comm group of the rank, NOTE [Pipelined step]).
  int lane = kCallerThread;
  int64_t start_ns = 0;
  int64_t end_ns = 0;

  static constexpr int kCallerThread = -1;
};

struct StepStats {
  // Phases, in order: gradients packed into the buckets and reduced
  // (Reduce + ReduceScatter); Muon on the owned shards (momentum,
  // Newton-Schulz, update); AdamW on the bucket shards; model copies written
  // and synchronised (Broadcast + AllGather).
  double reduce_seconds = 0;
  double muon_seconds = 0;
  double adamw_seconds = 0;
  double sync_seconds = 0;
  double total_seconds = 0;
  StepCommBytes comm;
  // NOTE [Step trace]: filled only with StepOptions::trace.
  absl::Time started = absl::InfinitePast();  // wall clock at the step's start
  std::vector<StepSpan> spans;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_OPTIMIZER_STEP_STATS_H_
