#include "worker/metrics.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plan/memory.h"

namespace muonshard::worker {
namespace {

using prometheus::Labels;

// Step phases run from sub-millisecond (tiny models) to seconds (real
// shards on CPU).
const prometheus::Histogram::BucketBoundaries& SecondsBuckets() {
  static const auto* const buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  return *buckets;
}

prometheus::Gauge& Gauge(prometheus::Registry& r, const std::string& name, const std::string& help,
                         const Labels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

prometheus::Counter& Counter(prometheus::Registry& r, const std::string& name, const std::string& help,
                             const Labels& labels) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}

Labels With(Labels labels, const std::string& key, const std::string& value) {
  labels.emplace(key, value);
  return labels;
}

// A histogram family of seconds with one series per phase (label `phase`,
// the names in `phases` order) into `out`.
template <size_t N>
void PhaseHistograms(prometheus::Registry& r, const std::string& name, const std::string& help, const Labels& labels,
                     const char* const (&phases)[N], std::array<prometheus::Histogram*, N>& out) {
  auto& family = prometheus::BuildHistogram().Name(name).Help(help).Register(r);
  for (size_t i = 0; i < N; ++i) out[i] = &family.Add(With(labels, "phase", phases[i]), SecondsBuckets());
}

}  // namespace

WorkerMetrics::WorkerMetrics(const std::string& job, int rank)
    : labels_{{"job", job}, {"rank", absl::StrCat(rank)}},
      registry_(std::make_shared<prometheus::Registry>()),
      state_bytes_(Gauge(*registry_, "muonshard_worker_optimizer_state_bytes",
                         "Optimizer state (fp32 masters, momenta, moments) allocated by this rank", labels_)),
      plan_state_bytes_(Gauge(*registry_, "muonshard_worker_plan_optimizer_state_bytes",
                              "Optimizer state bytes the plan assigns to this rank", labels_)),
      imbalance_(Gauge(*registry_, "muonshard_worker_plan_memory_imbalance_ratio",
                       "The plan's optimizer-state imbalance over ranks, (max - min) / max", labels_)),
      plan_memory_(prometheus::BuildGauge()
                       .Name("muonshard_worker_plan_memory_bytes")
                       .Help("The rank's training memory as its plan states it, by term (docs/planner.md, Memory)")
                       .Register(*registry_)),
      headroom_(prometheus::BuildGauge()
                    .Name("muonshard_worker_plan_memory_headroom_bytes")
                    .Help("The rank's device capacity minus its planned training memory (plans with a capacity)")
                    .Register(*registry_)),
      train_step_seconds_(prometheus::BuildHistogram()
                              .Name("muonshard_worker_train_step_seconds")
                              .Help("One training step: local gradients plus the optimizer step")
                              .Register(*registry_)
                              .Add(labels_, SecondsBuckets())),
      ns_flops_(Counter(*registry_, "muonshard_worker_ns_flops_total",
                        "Newton-Schulz FLOPs run on the matrices this rank owns (the plan's per-step figure)",
                        labels_)),
      loss_(Gauge(*registry_, "muonshard_worker_loss", "This rank's training loss before the last step", labels_)),
      plan_version_(Gauge(*registry_, "muonshard_worker_plan_version", "Plan version the worker runs", labels_)),
      generation_(Gauge(*registry_, "muonshard_worker_generation", "Job generation the worker joined", labels_)),
      steps_(Counter(*registry_, "muonshard_worker_steps_total", "Optimizer steps completed", labels_)),
      restarts_(Counter(*registry_, "muonshard_worker_restarts_total",
                        "Recoveries of this process: the group broke, it re-joined and restored", labels_)),
      buddy_bytes_(Gauge(*registry_, "muonshard_worker_buddy_bytes",
                         "Host memory held by buddy copies: this rank's snapshot and its left neighbour's copy",
                         labels_)),
      checkpoint_saved_(Gauge(*registry_, "muonshard_worker_checkpoint_last_success_timestamp_seconds",
                              "Unix time this rank last completed a checkpoint save; 0 before the first", labels_)),
      checkpoint_failures_(Counter(*registry_, "muonshard_worker_checkpoint_failures_total",
                                   "Checkpoint saves that failed on this rank", labels_)) {
  PhaseHistograms(*registry_, "muonshard_worker_step_seconds",
                  "Optimizer step time by phase: reduce (gradients to owners / shards), "
                  "orthogonalise (Muon: momentum, Newton-Schulz, update), adamw, sync "
                  "(parameters broadcast / all-gathered), and step (the whole optimizer step; the pipelined "
                  "step overlaps the other phases, so they sum to more)",
                  labels_, kStepPhases, phases_);
  auto& comm = prometheus::BuildCounter()
                   .Name("muonshard_worker_comm_bytes_total")
                   .Help("Bytes handed to collectives by the optimizer step, by op (the plan's accounting)")
                   .Register(*registry_);
  for (size_t i = 0; i < comm_bytes_.size(); ++i) {
    comm_bytes_[i] = &comm.Add(With(labels_, "op", kCommOps[i]));
  }
  PhaseHistograms(*registry_, "muonshard_worker_recovery_seconds",
                  "Recovery time by phase: detect (interrupted step to its error), abort (report, tear "
                  "down), rendezvous (re-join, wait for the group), restore (checkpoint load)",
                  labels_, kRecoveryPhases, recovery_);
  PhaseHistograms(*registry_, "muonshard_worker_checkpoint_seconds",
                  "Checkpoint save time by phase: write (this rank's file), barrier (all ranks' "
                  "files written), commit (rank 0: index, rename, latest)",
                  labels_, kCheckpointPhases, checkpoint_);
}

void WorkerMetrics::RecordCheckpointPhase(size_t phase, double seconds) { checkpoint_[phase]->Observe(seconds); }

void WorkerMetrics::SetCheckpointSaved(absl::Time at) {
  checkpoint_saved_.Set(absl::ToDoubleSeconds(at - absl::UnixEpoch()));
}

void WorkerMetrics::CountCheckpointFailure() { checkpoint_failures_.Increment(); }

void WorkerMetrics::SetBuddyBytes(int64_t bytes) { buddy_bytes_.Set(static_cast<double>(bytes)); }

void WorkerMetrics::RecordRecovery(const std::array<double, 4>& phase_seconds) {
  for (size_t i = 0; i < recovery_.size(); ++i) recovery_[i]->Observe(phase_seconds[i]);
  restarts_.Increment();
}

void WorkerMetrics::SetPlan(const v1::RankView& view, int64_t plan_version, int64_t generation) {
  plan_state_bytes_.Set(static_cast<double>(view.rank().optimizer_state_bytes()));
  imbalance_.Set(view.stats().memory_imbalance());
  SetPlanMemory(view.rank().memory());
  plan_version_.Set(static_cast<double>(plan_version));
  generation_.Set(static_cast<double>(generation));
}

void WorkerMetrics::SetPlanMemory(const v1::RankMemory& memory) {
  for (const planner::MemoryTerm& term : planner::MemoryTerms()) {
    plan_memory_.Add(With(labels_, "term", term.name)).Set(static_cast<double>((memory.*term.get)()));
  }
  plan_memory_.Add(With(labels_, "term", "total")).Set(static_cast<double>(memory.total_bytes()));
  prometheus::Gauge& headroom = headroom_.Add(labels_);
  if (memory.capacity_bytes() > 0) {
    headroom.Set(static_cast<double>(memory.headroom_bytes()));
  } else {
    headroom_.Remove(&headroom);
  }
}

void WorkerMetrics::SetOptimizerStateBytes(int64_t bytes) { state_bytes_.Set(static_cast<double>(bytes)); }

void WorkerMetrics::RecordStep(const StepStats& stats, double loss, double ns_flops, double train_step_seconds) {
  const double phase_seconds[] = {stats.reduce_seconds, stats.muon_seconds, stats.adamw_seconds, stats.sync_seconds,
                                  stats.total_seconds};
  for (size_t i = 0; i < phases_.size(); ++i) phases_[i]->Observe(phase_seconds[i]);
  const int64_t op_bytes[] = {stats.comm.grad_reduce, stats.comm.grad_reduce_scatter, stats.comm.param_broadcast,
                              stats.comm.param_all_gather, stats.comm.tp};
  for (size_t i = 0; i < comm_bytes_.size(); ++i) comm_bytes_[i]->Increment(static_cast<double>(op_bytes[i]));
  train_step_seconds_.Observe(train_step_seconds);
  ns_flops_.Increment(ns_flops);
  loss_.Set(loss);
  steps_.Increment();
}

}  // namespace muonshard::worker
