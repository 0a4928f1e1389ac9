#ifndef MUONSHARD_COORDINATOR_SERVICE_METRICS_H_
#define MUONSHARD_COORDINATOR_SERVICE_METRICS_H_

// The coordinator's Prometheus metrics (prometheus-cpp), fed by the domain
// through CoordinatorObserver and by the gRPC adapter (RPC counts), served
// on /metrics by common/metrics_http.h.
//
// Exported names are listed in kExportedMetrics (dashboards and scrape rules
// use only these; a test checks the registry exports exactly them). Labels
// are only rank, colour, job, state, type, method and code.
//
// Thread-safe.

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/observer.h"
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
    "muonshard_workers",                                 // gauge {job, state}
    "muonshard_job_generation",                          // gauge {job}
    "muonshard_coordinator_job_events_total",            // counter {job, type}
    "muonshard_watch_streams",                           // gauge
    "muonshard_rpcs_total",                              // counter {method, code}
    "muonshard_coordinator_store_healthy",               // gauge, 1 or 0
    "muonshard_coordinator_store_write_failures_total",  // counter
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

class CoordinatorMetrics final : public CoordinatorObserver {
 public:
  CoordinatorMetrics();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  void RecordRpc(Rpc rpc, absl::StatusCode code);

  void OnPlanCreated(const v1::PlanVersionInfo& info, absl::Duration compute) override;
  void OnLatestPlan(const v1::PlanVersionInfo& info, const v1::Plan& plan) override;
  void OnJobEvent(const v1::JobEvent& event, const WorkerCounts& counts) override;
  void OnWatchers(int64_t count) override;
  void OnStoreWriteFailed(const absl::Status& error) override;
  void OnStoreHealth(bool healthy, const absl::Status& cause) override;

 private:
  using EventCounters = std::array<prometheus::Counter*, v1::JobEventType_ARRAYSIZE>;
  // The series of `job`'s events of `type` (nullptr: not counted).
  prometheus::Counter* JobEventCounter(const std::string& job, v1::JobEventType type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter& versions_created_;
  prometheus::Gauge& latest_version_;
  prometheus::Histogram& compute_seconds_;
  prometheus::Family<prometheus::Gauge>& state_bytes_;
  prometheus::Family<prometheus::Gauge>& ns_flops_;
  std::array<prometheus::Gauge*, 6> imbalance_;  // memory x3, flops x3
  prometheus::Family<prometheus::Gauge>& workers_;
  prometheus::Family<prometheus::Gauge>& generation_;
  prometheus::Family<prometheus::Counter>& job_events_;
  prometheus::Gauge& watch_streams_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Gauge& store_healthy_;
  prometheus::Counter& store_write_failures_;

  absl::Mutex mu_;
  std::vector<prometheus::Gauge*> rank_series_ ABSL_GUARDED_BY(mu_);  // of the latest plan
  // Per job, by JobEventType value.
  std::map<std::string, EventCounters> job_events_by_job_ ABSL_GUARDED_BY(mu_);
  // Per RPC and status code; created on first use (OK ones at startup).
  std::array<std::array<std::atomic<prometheus::Counter*>, 17>, kNumRpcs> rpc_counters_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_SERVICE_METRICS_H_
