#ifndef MUONSHARD_CLIENT_GRPC_PLAN_SOURCE_H_
#define MUONSHARD_CLIENT_GRPC_PLAN_SOURCE_H_

// GrpcPlanSource: PlanSource over the coordinator's GetPlan RPC (a rank's
// view, or the whole plan). Errors are the RPC's codes with the version
// named. Thread-safe; *client must outlive the source.

#include "client/coordinator_client.h"
#include "client/plan_source.h"

namespace muonshard::client {

class GrpcPlanSource : public PlanSource {
 public:
  explicit GrpcPlanSource(CoordinatorClient* client) : client_(client) {}

  absl::StatusOr<VersionedRankView> FetchRankView(int64_t version, int rank) override;
  absl::StatusOr<VersionedPlan> FetchPlan(int64_t version) override;

 private:
  CoordinatorClient* const client_;  // not owned
};

}  // namespace muonshard::client

#endif  // MUONSHARD_CLIENT_GRPC_PLAN_SOURCE_H_
