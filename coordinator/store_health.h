#ifndef MUONSHARD_COORDINATOR_STORE_HEALTH_H_
#define MUONSHARD_COORDINATOR_STORE_HEALTH_H_

// HealthTrackingPlanStore: a PlanStore that forwards every call to another
// one and remembers whether that store can still commit, so the server can
// take itself out of service (grpc health NOT_SERVING) while it cannot, e.g.
// on a full disk.
//
// Unhealthy from the first write (Put, SaveGeneration, ProbeWrite) that
// fails for a storage reason; healthy again from the next one that commits.
// Reads do not count: a read succeeding says nothing about commits. The
// server calls ProbeWrite periodically (StoreProbeThread), so health changes
// are seen without traffic and recover without a client retrying.
//
// A probe is a tiny write: on a nearly full disk it may commit where a big
// plan does not (the WAL reuses its file after a checkpoint). Health then
// follows the writes as they come: a failed Put marks the store unhealthy
// again until the next commit.
//
// Thread-safe. Changes are reported to the observer in order, under this
// object's lock (observers must be quick and must not call back).

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/observer.h"
#include "coordinator/plan_store.h"

namespace muonshard::coordinator {

class HealthTrackingPlanStore final : public ForwardingPlanStore {
 public:
  // *inner and *observer must outlive this object.
  HealthTrackingPlanStore(PlanStore* inner, CoordinatorObserver* observer)
      : ForwardingPlanStore(inner), observer_(observer) {}

  // False from a failed write until a write commits; true at first.
  bool healthy() const;

  absl::StatusOr<PutResult> Put(v1::PlanVersionInfo info, const v1::PlanRequest& canonical,
                                const v1::Plan& plan) override;
  absl::Status SaveGeneration(const std::string& job, int64_t generation) override;
  absl::Status ProbeWrite() override;

 private:
  // Updates the health from a write's outcome and reports what changed.
  void Record(const absl::Status& write);

  CoordinatorObserver* const observer_;
  mutable absl::Mutex mu_;
  bool healthy_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_STORE_HEALTH_H_
