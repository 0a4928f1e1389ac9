#ifndef MUONSHARD_COORDINATOR_METRICS_H_
#define MUONSHARD_COORDINATOR_METRICS_H_

// The coordinator's Prometheus metrics (prometheus-cpp), fed by the domain
// through CoordinatorObserver and by the gRPC adapter (RPC counts), served
// on /metrics by common/metrics_http.h.
//
// Exported names are listed in kExportedMetrics (dashboards and scrape rules
// use only these; a test checks the registry exports exactly them). Labels
// are only rank, colour, term, job, plan_version, state, type, method and
// code, and the info gauge's content_hash, model and world_size.
//
// NOTE [Plan gauges per job]: the muonshard_plan_* gauges describe the
// newest stored plan; the muonshard_job_plan_* ones the plan each job runs
// (CoordinatorObserver::OnJobPlan), labelled {job, plan_version}, from its
// first joined worker until it moves to another version (the old version's
// series are removed) or its last joined worker leaves or fails (all its
// series are removed). Series per running job: one info, 6 ratios, and per
// rank 2 x its colours (1 or 2) + 8 memory terms + 1 headroom (only with a
// device capacity), i.e. at most 7 + 13 x world_size; jobs are bounded by
// --max-jobs. The latest plan adds 13 x its world_size the same way.
//
// Thread-safe.

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/observer.h"
#include "muonshard/v1/coordinator.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace muonshard::coordinator {

// Every metric family the coordinator exports (histograms add _bucket,
// _sum and _count series).
inline constexpr const char* kExportedMetrics[] = {
    "muonshard_plan_versions_total",                     // counter
    "muonshard_plan_latest_version",                     // gauge
    "muonshard_plan_compute_seconds",                    // histogram
    "muonshard_plan_optimizer_state_bytes",              // gauge {rank, colour}
    "muonshard_plan_ns_flops",                           // gauge {rank, colour}
    "muonshard_plan_memory_imbalance_ratio",             // gauge, (max-min)/max
    "muonshard_plan_memory_max_over_mean_ratio",         // gauge
    "muonshard_plan_memory_max_over_lower_bound_ratio",  // gauge
    "muonshard_plan_flops_imbalance_ratio",              // gauge
    "muonshard_plan_flops_max_over_mean_ratio",          // gauge
    "muonshard_plan_flops_max_over_lower_bound_ratio",   // gauge
    "muonshard_plan_rank_memory_bytes",                  // gauge {rank, term}
    "muonshard_plan_rank_memory_headroom_bytes",         // gauge {rank}, ranks with a capacity
    // NOTE [Plan gauges per job]: the plan each job runs. The info gauge is 1
    // with labels job, plan_version, content_hash, model and world_size, the
    // others have job and plan_version and their latest-plan counterpart's.
    "muonshard_job_plan_info",                               // gauge
    "muonshard_job_plan_optimizer_state_bytes",              // gauge {.., rank, colour}
    "muonshard_job_plan_ns_flops",                           // gauge {.., rank, colour}
    "muonshard_job_plan_memory_imbalance_ratio",             // gauge
    "muonshard_job_plan_memory_max_over_mean_ratio",         // gauge
    "muonshard_job_plan_memory_max_over_lower_bound_ratio",  // gauge
    "muonshard_job_plan_flops_imbalance_ratio",              // gauge
    "muonshard_job_plan_flops_max_over_mean_ratio",          // gauge
    "muonshard_job_plan_flops_max_over_lower_bound_ratio",   // gauge
    "muonshard_job_plan_rank_memory_bytes",                  // gauge {.., rank, term}
    "muonshard_job_plan_rank_memory_headroom_bytes",         // gauge {.., rank}
    "muonshard_workers",                                     // gauge {job, state}
    "muonshard_job_generation",                              // gauge {job}
    "muonshard_coordinator_job_events_total",                // counter {job, type}
    "muonshard_watch_streams",                               // gauge
    "muonshard_rpcs_total",                                  // counter {method, code}
    "muonshard_coordinator_store_healthy",                   // gauge, 1 or 0
    "muonshard_coordinator_store_write_failures_total",      // counter
};

// The RPCs counted by muonshard_rpcs_total, in proto order.
enum class Rpc {
  kSubmitPlan,
  kGetPlan,
  kListPlans,
  kDiffPlans,
  kWatch,
  kJoinJob,
  kHeartbeat,
  kLeaveJob,
  kReportError,
  kListWorkers,
  kSetKey,
  kGetKey,
  kWaitKeys,
};
constexpr int kNumRpcs = 13;
const char* RpcName(Rpc rpc);

// Optimizer-state bytes and Newton-Schulz FLOPs of one rank in one colour.
struct RankColourLoad {
  int rank = 0;
  v1::Colour colour = v1::COLOUR_UNSPECIFIED;
  int64_t state_bytes = 0;
  double ns_flops = 0;
};

// Per rank, one entry per colour of the groups it belongs to. The state bytes
// of a rank's colours sum to its RankPlan.optimizer_state_bytes: Muon owned
// elements x 8 + AdamW shard elements (with padding) x 12, by group colour.
std::vector<RankColourLoad> RankColourLoads(const v1::Plan& plan);

// The `term` label values of the memory gauges, in RankMemory field order
// (total last), with the rank's bytes of each.
constexpr int kNumMemoryTerms = 8;
std::array<std::pair<const char*, int64_t>, kNumMemoryTerms> MemoryTerms(const v1::RankMemory& m);

class CoordinatorMetrics final : public CoordinatorObserver {
 public:
  CoordinatorMetrics();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  void RecordRpc(Rpc rpc, absl::StatusCode code);

  void OnPlanCreated(const v1::PlanVersionInfo& info, absl::Duration compute) override;
  void OnLatestPlan(const v1::PlanVersionInfo& info, const v1::Plan& plan) override;
  void OnJobEvent(const v1::JobEvent& event, const WorkerCounts& counts) override;
  void OnJobPlan(const std::string& job, const v1::PlanVersionInfo& info, const v1::Plan* plan) override;
  void OnJobPlanEnded(const std::string& job) override;
  void OnWatchers(int64_t count) override;
  void OnStoreWriteFailed(const absl::Status& error) override;
  void OnStoreHealth(bool healthy, const absl::Status& cause) override;

 private:
  using EventCounters = std::array<prometheus::Counter*, v1::JobEventType_ARRAYSIZE>;
  using GaugeFamily = prometheus::Family<prometheus::Gauge>;

  // Gauges added together and removed together (one plan's).
  class SeriesSet {
   public:
    void Add(GaugeFamily& family, const prometheus::Labels& labels, double value);
    void RemoveAll();

   private:
    std::vector<std::pair<GaugeFamily*, prometheus::Gauge*>> series_;
  };

  // The per-rank families of the latest plan or of the plans jobs run.
  struct RankFamilies {
    GaugeFamily* state_bytes;
    GaugeFamily* ns_flops;
    GaugeFamily* memory;
    GaugeFamily* headroom;
  };

  // `plan`'s per-rank series (`loads` = RankColourLoads(plan)) labelled
  // `base` plus rank (and colour or term), into `out`.
  static void AddRankSeries(const RankFamilies& families, const prometheus::Labels& base, const v1::Plan& plan,
                            const std::vector<RankColourLoad>& loads, SeriesSet& out);

  // The series of `job`'s events of `type` (nullptr: not counted).
  prometheus::Counter* JobEventCounter(const std::string& job, v1::JobEventType type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter& versions_created_;
  prometheus::Gauge& latest_version_;
  prometheus::Histogram& compute_seconds_;
  RankFamilies latest_families_;
  std::array<prometheus::Gauge*, 6> imbalance_;  // memory x3, flops x3
  GaugeFamily& job_info_;
  RankFamilies job_families_;
  std::array<GaugeFamily*, 6> job_ratios_;  // as imbalance_
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Gauge>& generation_;
  prometheus::Family<prometheus::Counter>& job_events_;
  prometheus::Gauge& watch_streams_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Gauge& store_healthy_;
  prometheus::Counter& store_write_failures_;

  absl::Mutex mu_;
  SeriesSet latest_series_ ABSL_GUARDED_BY(mu_);  // per rank, of the latest plan
  // NOTE [Plan gauges per job]: every series of the plan each job runs.
  std::map<std::string, SeriesSet> job_series_ ABSL_GUARDED_BY(mu_);
  // Per job, by JobEventType value.
  std::map<std::string, EventCounters> job_events_by_job_ ABSL_GUARDED_BY(mu_);
  // Per RPC and status code; created on first use (OK ones at startup).
  std::array<std::array<std::atomic<prometheus::Counter*>, 17>, kNumRpcs> rpc_counters_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_METRICS_H_
