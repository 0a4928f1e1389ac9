#include "coordinator/store_health.h"

#include <utility>

namespace muonshard::coordinator {
namespace {

// INVALID_ARGUMENT is the caller's mistake (an empty content hash); every
// other error means the store did not commit.
bool IsStorageFailure(const absl::Status& s) { return !s.ok() && s.code() != absl::StatusCode::kInvalidArgument; }

}  // namespace

bool HealthTrackingPlanStore::healthy() const {
  absl::MutexLock lock(&mu_);
  return healthy_;
}

absl::StatusOr<PlanStore::PutResult> HealthTrackingPlanStore::Put(v1::PlanVersionInfo info,
                                                                  const v1::PlanRequest& canonical,
                                                                  const v1::Plan& plan) {
  absl::StatusOr<PutResult> result = inner()->Put(std::move(info), canonical, plan);
  Record(result.status());
  return result;
}

absl::Status HealthTrackingPlanStore::SaveGeneration(const std::string& job, int64_t generation) {
  absl::Status s = inner()->SaveGeneration(job, generation);
  Record(s);
  return s;
}

absl::Status HealthTrackingPlanStore::ProbeWrite() {
  absl::Status s = inner()->ProbeWrite();
  Record(s);
  return s;
}

void HealthTrackingPlanStore::Record(const absl::Status& write) {
  if (!write.ok() && !IsStorageFailure(write)) return;
  absl::MutexLock lock(&mu_);
  if (!write.ok()) observer_->OnStoreWriteFailed(write);
  if (healthy_ == write.ok()) return;
  healthy_ = write.ok();
  observer_->OnStoreHealth(healthy_, write);
}

}  // namespace muonshard::coordinator
