#ifndef MUONSHARD_CLIENT_PLAN_SOURCE_H_
#define MUONSHARD_CLIENT_PLAN_SOURCE_H_

// PlanSource: where a worker gets its plan from — the coordinator
// (GrpcPlanSource, grpc_plan_source.h) or memory (InMemoryPlanSource: tests,
// single-host tools). FetchJoinedView() is what a worker runs after joining:
// its rank's view of the job's plan version, checked against what JoinJob
// said, so a worker never executes a plan its group does not run.
//
// Thread-safety: implementations are thread-safe.

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/joined_job.h"
#include "muonshard/v1/plan.pb.h"

namespace muonshard::client {

// A plan version and what it holds.
struct VersionedRankView {
  int64_t version = 0;
  v1::RankView view;
};
struct VersionedPlan {
  int64_t version = 0;
  v1::Plan plan;
  // The canonical request it was computed from (empty when the source does
  // not keep it): what a checkpoint stores to reshard its state later.
  v1::PlanRequest request;
};

class PlanSource {
 public:
  virtual ~PlanSource() = default;

  // The view of `rank` in plan `version` (0 = the latest).
  // Possible errors: NOT_FOUND (version), INVALID_ARGUMENT (rank outside the
  // plan's world), FAILED_PRECONDITION (nothing stored yet), UNAVAILABLE.
  virtual absl::StatusOr<VersionedRankView> FetchRankView(int64_t version, int rank) = 0;

  // The whole plan `version` (0 = the latest): for reference runs and for
  // merging parameter dumps. Errors as FetchRankView.
  virtual absl::StatusOr<VersionedPlan> FetchPlan(int64_t version) = 0;
};

// Fetches `joined`'s view (its plan version and rank) and checks that it is
// the plan the group runs: the view's content hash equals JoinJob's, and the
// view is of `joined.rank` in a world of `joined.world_size`.
// Possible errors: FAILED_PRECONDITION naming both hashes / ranks / sizes on
// a mismatch; the source's errors.
absl::StatusOr<v1::RankView> FetchJoinedView(PlanSource& source, const JoinedJob& joined);

// Plans held in memory, versions numbered from 1 in Add() order.
class InMemoryPlanSource : public PlanSource {
 public:
  // Stores `plan` (and optionally its request) as the next version; returns it.
  int64_t Add(v1::Plan plan, v1::PlanRequest request = {});

  absl::StatusOr<VersionedRankView> FetchRankView(int64_t version, int rank) override;
  absl::StatusOr<VersionedPlan> FetchPlan(int64_t version) override;

 private:
  absl::Mutex mu_;
  std::map<int64_t, VersionedPlan> plans_ ABSL_GUARDED_BY(mu_);
};

}  // namespace muonshard::client

#endif  // MUONSHARD_CLIENT_PLAN_SOURCE_H_
