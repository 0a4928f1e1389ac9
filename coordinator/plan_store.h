#ifndef MUONSHARD_COORDINATOR_PLAN_STORE_H_
#define MUONSHARD_COORDINATOR_PLAN_STORE_H_

// PlanStore: the coordinator's durable state. Every plan version with its
// canonical request, content hash and metadata, plus each job's last
// generation (so generations keep growing across coordinator restarts).
//
// Versions are assigned by the store: 1, 2, 3, ... in Put order, never reused
// (not even after a restart or a crash). A Put whose content hash is already
// stored returns that version instead of adding one.
//
// Implementations are thread-safe. Plans and requests are kept as compressed
// blobs (blob_codec.h) by every implementation, so the in-memory store used by
// unit tests exercises the same encoding as SqlitePlanStore.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "muonshard/v1/coordinator.pb.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::coordinator {

class PlanStore {
 public:
  struct PutResult {
    v1::PlanVersionInfo info;  // as stored, version and stored_bytes set
    bool created = false;      // false: info.content_hash was stored before
  };

  virtual ~PlanStore() = default;

  // Stores `plan` (computed from `canonical`) under a new version, unless a
  // version with info.content_hash exists. `info` supplies every field but
  // version and stored_bytes, which the store sets. Durable when it returns
  // (a crash right after loses nothing).
  // Possible errors: INVALID_ARGUMENT (empty content hash), INTERNAL/
  // UNAVAILABLE (storage failure).
  virtual absl::StatusOr<PutResult> Put(v1::PlanVersionInfo info, const v1::PlanRequest& canonical,
                                        const v1::Plan& plan) = 0;

  // Possible errors: NOT_FOUND (unknown version), DATA_LOSS (corrupt blob).
  virtual absl::StatusOr<v1::Plan> GetPlan(int64_t version) = 0;
  virtual absl::StatusOr<v1::PlanRequest> GetRequest(int64_t version) = 0;

  // Metadata of every version, oldest first (no plan is decoded).
  virtual absl::StatusOr<std::vector<v1::PlanVersionInfo>> ListVersions() = 0;

  // The last generation recorded for `job`; 0 when none was.
  virtual absl::StatusOr<int64_t> LoadGeneration(const std::string& job) = 0;
  // Records `generation` for `job` (durably).
  virtual absl::Status SaveGeneration(const std::string& job, int64_t generation) = 0;

  // A small durable write that no reader sees, to learn whether the store
  // still commits while nothing else writes (HealthTrackingPlanStore).
  // Possible errors: INTERNAL/UNAVAILABLE (storage failure).
  virtual absl::Status ProbeWrite() = 0;
};

// Forwards every call to `inner` (which must outlive it): the base of stores
// that watch or alter a few calls of another (HealthTrackingPlanStore, test
// fakes failing writes).
class ForwardingPlanStore : public PlanStore {
 public:
  explicit ForwardingPlanStore(PlanStore* inner) : inner_(inner) {}

  absl::StatusOr<PutResult> Put(v1::PlanVersionInfo info, const v1::PlanRequest& canonical,
                                const v1::Plan& plan) override {
    return inner_->Put(std::move(info), canonical, plan);
  }
  absl::StatusOr<v1::Plan> GetPlan(int64_t version) override { return inner_->GetPlan(version); }
  absl::StatusOr<v1::PlanRequest> GetRequest(int64_t version) override { return inner_->GetRequest(version); }
  absl::StatusOr<std::vector<v1::PlanVersionInfo>> ListVersions() override { return inner_->ListVersions(); }
  absl::StatusOr<int64_t> LoadGeneration(const std::string& job) override { return inner_->LoadGeneration(job); }
  absl::Status SaveGeneration(const std::string& job, int64_t generation) override {
    return inner_->SaveGeneration(job, generation);
  }
  absl::Status ProbeWrite() override { return inner_->ProbeWrite(); }

 protected:
  PlanStore* inner() const { return inner_; }

 private:
  PlanStore* const inner_;
};

// A store in process memory, for unit tests; forgets everything when destroyed.
std::unique_ptr<PlanStore> NewInMemoryPlanStore();

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_PLAN_STORE_H_
