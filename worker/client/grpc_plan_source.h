#ifndef MUONSHARD_WORKER_CLIENT_GRPC_PLAN_SOURCE_H_
#define MUONSHARD_WORKER_CLIENT_GRPC_PLAN_SOURCE_H_

// GrpcPlanSource: PlanSource over the coordinator's GetPlan RPC (a rank's
// view, or the whole plan). Errors are the RPC's codes with the version
// named. Thread-safe; *client must outlive the source.

#include "cli/coordinator_client.h"
#include "worker/client/plan_source.h"

namespace muonshard::worker {

class GrpcPlanSource : public PlanSource {
 public:
  explicit GrpcPlanSource(cli::CoordinatorClient* client) : client_(client) {}

  absl::StatusOr<VersionedRankView> FetchRankView(int64_t version, int rank) override;
  absl::StatusOr<VersionedPlan> FetchPlan(int64_t version) override;

 private:
  cli::CoordinatorClient* const client_;  // not owned
};

}  // namespace muonshard::worker

#endif  // MUONSHARD_WORKER_CLIENT_GRPC_PLAN_SOURCE_H_
