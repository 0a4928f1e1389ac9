#ifndef MUONSHARD_CLIENT_COORDINATOR_CALLS_H_
#define MUONSHARD_CLIENT_COORDINATOR_CALLS_H_

// The coordinator's unary plan and membership queries as plain functions
// over a CoordinatorClient: what muonshardctl's commands and the Python
// package (muonshard.Coordinator) call, so both send the same requests and
// see the same errors. Each call carries the client's deadline and token;
// errors are the server's status (INVALID_ARGUMENT, NOT_FOUND,
// FAILED_PRECONDITION, ...) or the transport's (UNAVAILABLE,
// DEADLINE_EXCEEDED, UNAUTHENTICATED), message unchanged.
//
// Thread-safe (the stub is).

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "common/clock.h"
#include "muonshard/v1/coordinator.pb.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::client {

// SubmitPlan: stores the plan of `request` (or finds an identical one).
absl::StatusOr<v1::SubmitPlanResponse> SubmitPlan(CoordinatorClient& client, const v1::PlanRequest& request);

// GetPlan: a whole plan, or one rank's view when request.rank is set.
absl::StatusOr<v1::GetPlanResponse> GetPlan(CoordinatorClient& client, const v1::GetPlanRequest& request);

// ListWorkers of `job` (empty: every job).
absl::StatusOr<v1::ListWorkersResponse> ListWorkers(CoordinatorClient& client, const std::string& job);

// Calls `rpc` until it answers anything but UNAVAILABLE (the coordinator
// unreachable for now: restarting, or on a loaded machine too slow to accept
// a connection within the channel's connect timeout) or `timeout` has
// passed, backing off from 100 ms to 2 s on `clock` (common/retry.h). For
// calls that may be repeated: joins, reports, plan fetches.
absl::Status RetryUnavailable(absl::Duration timeout, absl::FunctionRef<absl::Status()> rpc,
                              const Clock& clock = *RealClock());

}  // namespace muonshard::client

#endif  // MUONSHARD_CLIENT_COORDINATOR_CALLS_H_
