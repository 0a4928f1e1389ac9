#ifndef MUONSHARD_CLIENT_GRPC_PLAN_SOURCE_H_
#define MUONSHARD_CLIENT_GRPC_PLAN_SOURCE_H_

// GrpcPlanSource: PlanSource over the coordinator's GetPlan RPC (a rank's
// view, or the whole plan). Errors are the RPC's codes with the version
// named. Thread-safe; *client must outlive the source.

#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "client/plan_source.h"

namespace muonshard::client {

// Fetches are retried while the coordinator is UNAVAILABLE, up to `retry_for`
// (RetryUnavailable): a worker starting on a loaded machine, or while the
// coordinator restarts, waits for it as its join does.
class GrpcPlanSource : public PlanSource {
 public:
  explicit GrpcPlanSource(CoordinatorClient* client, absl::Duration retry_for = absl::Seconds(30))
      : client_(client), retry_for_(retry_for) {}

  absl::StatusOr<VersionedRankView> FetchRankView(int64_t version, int rank) override;
  absl::StatusOr<VersionedPlan> FetchPlan(int64_t version) override;

 private:
  CoordinatorClient* const client_;  // not owned
  const absl::Duration retry_for_;
};

}  // namespace muonshard::client

#endif  // MUONSHARD_CLIENT_GRPC_PLAN_SOURCE_H_
