#ifndef MUONSHARD_WORKER_METRICS_H_
#define MUONSHARD_WORKER_METRICS_H_

// A worker process's Prometheus metrics (prometheus-cpp), served on
// /metrics (default port 9465 + local rank) by common/metrics_http.h.
//
// Exported names are listed in kWorkerExportedMetrics (dashboards and scrape
// rules use only these; tests check that /metrics holds every one of them).
// Every series carries the labels job and rank; step phases add `phase`
// (reduce, orthogonalise, adamw, sync) and communication adds `op` (reduce,
// reduce_scatter, broadcast, all_gather — the plan's four per-step figures,
// see worker/comm/counting_communicator.h for how bytes are counted).
//
// Thread-safe (prometheus-cpp's metrics are; the scrape thread reads while
// the training thread writes).

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "muonshard/v1/plan.pb.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/labels.h"
#include "prometheus/registry.h"
#include "worker/optimizer/step_stats.h"

namespace muonshard::worker {

// Every metric family a worker exports (histograms add _bucket, _sum and
// _count series).
inline constexpr const char* kWorkerExportedMetrics[] = {
    "muonshard_worker_optimizer_state_bytes",                      // gauge: allocated by the optimizer
    "muonshard_worker_plan_optimizer_state_bytes",                 // gauge: the plan's figure for the rank
    "muonshard_worker_plan_memory_imbalance_ratio",                // gauge: the plan's (max-min)/max
    "muonshard_worker_step_seconds",                               // histogram {phase}
    "muonshard_worker_train_step_seconds",                         // histogram: gradients + optimizer step
    "muonshard_worker_comm_bytes_total",                           // counter {op}
    "muonshard_worker_ns_flops_total",                             // counter: Newton-Schulz FLOPs run
    "muonshard_worker_loss",                                       // gauge: this rank's loss before the last step
    "muonshard_worker_plan_version",                               // gauge
    "muonshard_worker_generation",                                 // gauge
    "muonshard_worker_steps_total",                                // counter
    "muonshard_worker_restarts_total",                             // counter: recoveries (NOTE [Recovery])
    "muonshard_worker_recovery_seconds",                           // histogram {phase}
    "muonshard_worker_buddy_bytes",                                // gauge: NOTE [Buddy copies] memory held
    "muonshard_worker_checkpoint_seconds",                         // histogram {phase}
    "muonshard_worker_checkpoint_last_success_timestamp_seconds",  // gauge: unix seconds; 0: none yet
    "muonshard_worker_checkpoint_failures_total",                  // counter: failed saves
    "muonshard_worker_plan_memory_bytes",                          // gauge {term}: the plan's RankMemory for the rank
    "muonshard_worker_plan_memory_headroom_bytes",                 // gauge: capacity - total; only with a capacity
};

// The `phase` label values: the phases in step order, then "step" (the whole
// optimizer step).
inline constexpr const char* kStepPhases[] = {"reduce", "orthogonalise", "adamw", "sync", "step"};
// The `phase` label values of a recovery, in order: detect (the interrupted
// step's start to its error), abort (report, tear the group down),
// rendezvous (join again, wait for the group, communicators), restore (load
// the newest checkpoint or the initial parameters).
inline constexpr const char* kRecoveryPhases[] = {"detect", "abort", "rendezvous", "restore"};
// The `phase` label values of a checkpoint save, in order: write (this
// rank's file: StateShards, WriteRankFile), barrier (all ranks' files
// written), commit (rank 0 only: CommitCheckpoint).
inline constexpr const char* kCheckpointPhases[] = {"write", "barrier", "commit"};
// Indices into kCheckpointPhases.
inline constexpr size_t kCheckpointWrite = 0;
inline constexpr size_t kCheckpointBarrier = 1;
inline constexpr size_t kCheckpointCommit = 2;
// The `op` label values.
inline constexpr const char* kCommOps[] = {"reduce", "reduce_scatter", "broadcast", "all_gather", "tp"};

class WorkerMetrics {
 public:
  WorkerMetrics(const std::string& job, int rank);

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // The plan the worker runs: version, generation, the rank's planned state
  // bytes, its planned memory by term (and headroom, when the plan has a
  // capacity) and the plan's memory imbalance (PlanStats.memory_imbalance).
  void SetPlan(const v1::RankView& view, int64_t plan_version, int64_t generation);
  // What the optimizer actually allocated.
  void SetOptimizerStateBytes(int64_t bytes);
  // One finished step: its phases and comm bytes, the rank's loss before it,
  // the Newton-Schulz FLOPs it ran and the whole training step's seconds
  // (gradients included).
  void RecordStep(const StepStats& stats, double loss, double ns_flops, double train_step_seconds);
  // Host memory held by buddy copies (NOTE [Buddy copies]).
  void SetBuddyBytes(int64_t bytes);
  // One recovery: its phases' seconds in kRecoveryPhases order.
  void RecordRecovery(const std::array<double, 4>& phase_seconds);
  // One phase of a checkpoint save: `phase` indexes kCheckpointPhases.
  void RecordCheckpointPhase(size_t phase, double seconds);
  // A save completed on this rank at `at`.
  void SetCheckpointSaved(absl::Time at);
  // A save failed on this rank.
  void CountCheckpointFailure();

 private:
  void SetPlanMemory(const v1::RankMemory& memory);

  const prometheus::Labels labels_;  // job and rank, on every series
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge& state_bytes_;
  prometheus::Gauge& plan_state_bytes_;
  prometheus::Gauge& imbalance_;
  prometheus::Family<prometheus::Gauge>& plan_memory_;  // {term}: planner::MemoryTerms() and "total"
  prometheus::Family<prometheus::Gauge>& headroom_;
  std::array<prometheus::Histogram*, 5> phases_;  // kStepPhases order
  prometheus::Histogram& train_step_seconds_;
  std::array<prometheus::Counter*, 5> comm_bytes_;  // kCommOps order
  prometheus::Counter& ns_flops_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& plan_version_;
  prometheus::Gauge& generation_;
  prometheus::Counter& steps_;
  prometheus::Counter& restarts_;
  prometheus::Gauge& buddy_bytes_;
  std::array<prometheus::Histogram*, 4> recovery_;    // kRecoveryPhases order
  std::array<prometheus::Histogram*, 3> checkpoint_;  // kCheckpointPhases order
  prometheus::Gauge& checkpoint_saved_;
  prometheus::Counter& checkpoint_failures_;
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_METRICS_H_
