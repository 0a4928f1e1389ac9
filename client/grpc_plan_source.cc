#include "client/grpc_plan_source.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/coordinator_calls.h"
#include "common/status_macros.h"

namespace muonshard::client {
namespace {

std::string VersionName(int64_t version) {
  return version == 0 ? std::string("the latest plan version") : absl::StrCat("plan version ", version);
}

absl::StatusOr<v1::GetPlanResponse> FetchVersion(CoordinatorClient& client, int64_t version, std::optional<int> rank,
                                                 absl::Duration retry_for) {
  v1::GetPlanRequest request;
  request.set_version(version);
  if (rank.has_value()) request.set_rank(*rank);
  request.set_with_request(!rank.has_value());
  absl::StatusOr<v1::GetPlanResponse> response;
  const absl::Status s = RetryUnavailable(retry_for, [&] {
    response = GetPlan(client, request);
    return response.status();
  });
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("fetching ", VersionName(version),
                                    rank.has_value() ? absl::StrCat(" (rank ", *rank, ")") : ""));
  }
  return response;
}

}  // namespace

absl::StatusOr<VersionedRankView> GrpcPlanSource::FetchRankView(int64_t version, int rank) {
  MUONSHARD_ASSIGN_OR_RETURN(v1::GetPlanResponse response, FetchVersion(*client_, version, rank, retry_for_));
  if (!response.has_rank_view()) {
    return absl::InternalError(absl::StrCat("GetPlan of rank ", rank, " returned no rank view"));
  }
  return VersionedRankView{response.info().version(), std::move(*response.mutable_rank_view())};
}

absl::StatusOr<VersionedPlan> GrpcPlanSource::FetchPlan(int64_t version) {
  MUONSHARD_ASSIGN_OR_RETURN(v1::GetPlanResponse response, FetchVersion(*client_, version, std::nullopt, retry_for_));
  if (!response.has_plan()) return absl::InternalError("GetPlan returned no plan");
  return VersionedPlan{response.info().version(), std::move(*response.mutable_plan()),
                       std::move(*response.mutable_request())};
}

}  // namespace muonshard::client
