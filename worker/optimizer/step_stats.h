#ifndef MUONSHARD_WORKER_OPTIMIZER_STEP_STATS_H_
#define MUONSHARD_WORKER_OPTIMIZER_STEP_STATS_H_

// What one sharded optimizer step cost on one rank: wall time per phase and
// the bytes handed to each kind of collective, counted as the plan counts
// them (RankPlan.grad_reduce_bytes etc.; see counting_communicator.h). A
// metrics exporter turns these into muonshard_* series.

#include <cstdint>

namespace muonshard::worker {

struct StepCommBytes {
  int64_t grad_reduce = 0;          // Muon gradients, Reduce to the owners
  int64_t grad_reduce_scatter = 0;  // AdamW gradients, ReduceScatter
  int64_t param_broadcast = 0;      // Muon parameters, Broadcast from owners
  int64_t param_all_gather = 0;     // AdamW parameters, AllGather
  // Tensor-parallel Muon (TENSOR_PARALLEL groups): bytes this rank sends
  // plus receives in the gathers, scatters and all-gathers of the NS
  // inputs and results, the plan's tp_send_bytes + tp_recv_bytes.
  int64_t tp = 0;
  int64_t collectives = 0;          // calls of any kind

  int64_t total() const { return grad_reduce + grad_reduce_scatter + param_broadcast + param_all_gather + tp; }
  bool operator==(const StepCommBytes& o) const {
    return grad_reduce == o.grad_reduce && grad_reduce_scatter == o.grad_reduce_scatter &&
           param_broadcast == o.param_broadcast && param_all_gather == o.param_all_gather && tp == o.tp &&
           collectives == o.collectives;
  }
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
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_OPTIMIZER_STEP_STATS_H_
