#include "client/coordinator_calls.h"

#include "common/grpc_status.h"
#include "common/retry.h"

namespace muonshard::client {

absl::StatusOr<v1::SubmitPlanResponse> SubmitPlan(CoordinatorClient& client, const v1::PlanRequest& request) {
  v1::SubmitPlanRequest rpc;
  *rpc.mutable_request() = request;
  v1::SubmitPlanResponse response;
  auto ctx = client.NewContext();
  absl::Status s = FromGrpcStatus(client.stub().SubmitPlan(ctx.get(), rpc, &response));
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<v1::GetPlanResponse> GetPlan(CoordinatorClient& client, const v1::GetPlanRequest& request) {
  v1::GetPlanResponse response;
  auto ctx = client.NewContext();
  absl::Status s = FromGrpcStatus(client.stub().GetPlan(ctx.get(), request, &response));
  if (!s.ok()) return s;
  return response;
}

absl::Status RetryUnavailable(absl::Duration timeout, absl::FunctionRef<absl::Status()> rpc, const Clock& clock) {
  RetryPolicy policy;
  policy.backoff = {absl::Milliseconds(100), 2.0, absl::Seconds(2)};
  policy.timeout = timeout;
  return Retry(policy, clock, absl::IsUnavailable, rpc);
}

absl::StatusOr<v1::ListWorkersResponse> ListWorkers(CoordinatorClient& client, const std::string& job) {
  v1::ListWorkersRequest request;
  request.set_job(job);
  v1::ListWorkersResponse response;
  auto ctx = client.NewContext();
  absl::Status s = FromGrpcStatus(client.stub().ListWorkers(ctx.get(), request, &response));
  if (!s.ok()) return s;
  return response;
}

}  // namespace muonshard::client
