#ifndef MUONSHARD_COORDINATOR_OBSERVER_H_
#define MUONSHARD_COORDINATOR_OBSERVER_H_

// CoordinatorObserver: what the domain (and the store under it, through
// HealthTrackingPlanStore) tells the outside world about its state changes
// (metrics, the one-line-per-change log, grpc health), so that neither
// depends on prometheus, gRPC or a logger.
//
// Methods are called synchronously, in the order the changes happen, some
// under the service's locks: implementations must be quick and must not call
// back into CoordinatorService. They may be called from several threads.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "muonshard/v1/coordinator.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::coordinator {

// Workers of one job by state.
struct WorkerCounts {
  int64_t joined = 0;
  int64_t failed = 0;
  int64_t left = 0;
};

class CoordinatorObserver {
 public:
  virtual ~CoordinatorObserver() = default;

  // A new version was stored; `compute` is the planner's time.
  virtual void OnPlanCreated(const v1::PlanVersionInfo& info, absl::Duration compute) {}
  // The latest version is now `plan` (also called once at startup).
  virtual void OnLatestPlan(const v1::PlanVersionInfo& info, const v1::Plan& plan) {}
  // A membership event; `counts` is the job's state after it.
  virtual void OnJobEvent(const v1::JobEvent& event, const WorkerCounts& counts) {}
  // `job` runs `info`'s version from now on: its first worker joined, or it
  // moved to another version (an elastic resize, or a first join after all
  // its workers had gone). `plan` is null when it could not be read (store).
  virtual void OnJobPlan(const std::string& job, const v1::PlanVersionInfo& info, const v1::Plan* plan) {}
  // `job` runs no plan any more: its last joined worker left or failed.
  virtual void OnJobPlanEnded(const std::string& job) {}
  // Number of open watch streams.
  virtual void OnWatchers(int64_t count) {}
  // A store write failed with `error` (HealthTrackingPlanStore).
  virtual void OnStoreWriteFailed(const absl::Status& error) {}
  // The store stopped committing (`cause`: the write that failed) or commits
  // again (`cause` OK). Called on changes only, in the order they happen.
  virtual void OnStoreHealth(bool healthy, const absl::Status& cause) {}
};

// Forwards to several observers in order.
class ObserverList final : public CoordinatorObserver {
 public:
  explicit ObserverList(std::vector<CoordinatorObserver*> observers) : observers_(std::move(observers)) {}
  void OnPlanCreated(const v1::PlanVersionInfo& info, absl::Duration compute) override {
    for (CoordinatorObserver* o : observers_) o->OnPlanCreated(info, compute);
  }
  void OnLatestPlan(const v1::PlanVersionInfo& info, const v1::Plan& plan) override {
    for (CoordinatorObserver* o : observers_) o->OnLatestPlan(info, plan);
  }
  void OnJobEvent(const v1::JobEvent& event, const WorkerCounts& counts) override {
    for (CoordinatorObserver* o : observers_) o->OnJobEvent(event, counts);
  }
  void OnJobPlan(const std::string& job, const v1::PlanVersionInfo& info, const v1::Plan* plan) override {
    for (CoordinatorObserver* o : observers_) o->OnJobPlan(job, info, plan);
  }
  void OnJobPlanEnded(const std::string& job) override {
    for (CoordinatorObserver* o : observers_) o->OnJobPlanEnded(job);
  }
  void OnWatchers(int64_t count) override {
    for (CoordinatorObserver* o : observers_) o->OnWatchers(count);
  }
  void OnStoreWriteFailed(const absl::Status& error) override {
    for (CoordinatorObserver* o : observers_) o->OnStoreWriteFailed(error);
  }
  void OnStoreHealth(bool healthy, const absl::Status& cause) override {
    for (CoordinatorObserver* o : observers_) o->OnStoreHealth(healthy, cause);
  }

 private:
  std::vector<CoordinatorObserver*> observers_;  // not owned
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_OBSERVER_H_
