#include "client/plan_source.h"

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/plan_view.h"

namespace muonshard::client {

absl::StatusOr<v1::RankView> FetchJoinedView(PlanSource& source, const JoinedJob& joined) {
  MUONSHARD_ASSIGN_OR_RETURN(VersionedRankView fetched, source.FetchRankView(joined.plan_version, joined.rank));
  const v1::RankView& view = fetched.view;
  const std::string where = absl::StrCat("job \"", joined.job, "\" runs plan version ", joined.plan_version);
  if (fetched.version != joined.plan_version) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, " but the plan source returned version ", fetched.version));
  }
  if (view.content_hash() != joined.content_hash) {
    return absl::FailedPreconditionError(absl::StrCat(where, " with content hash ", joined.content_hash,
                                                      "; the fetched view has ", view.content_hash()));
  }
  if (view.rank().rank() != joined.rank) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": asked for rank ", joined.rank, "'s view, got rank ", view.rank().rank(), "'s"));
  }
  const int world = view.topology().world_size();
  if (world != joined.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, " on ", joined.world_size, " ranks; the fetched view is of a world of ", world));
  }
  return std::move(fetched.view);
}

int64_t InMemoryPlanSource::Add(v1::Plan plan, v1::PlanRequest request) {
  absl::MutexLock lock(&mu_);
  const int64_t version = plans_.empty() ? 1 : plans_.rbegin()->first + 1;
  plans_.emplace(version, VersionedPlan{version, std::move(plan), std::move(request)});
  return version;
}

absl::StatusOr<VersionedPlan> InMemoryPlanSource::FetchPlan(int64_t version) {
  absl::MutexLock lock(&mu_);
  if (plans_.empty()) return absl::FailedPreconditionError("no plan stored");
  auto it = version == 0 ? std::prev(plans_.end()) : plans_.find(version);
  if (it == plans_.end()) return absl::NotFoundError(absl::StrCat("plan version ", version, " not found"));
  return it->second;
}

absl::StatusOr<VersionedRankView> InMemoryPlanSource::FetchRankView(int64_t version, int rank) {
  MUONSHARD_ASSIGN_OR_RETURN(VersionedPlan plan, FetchPlan(version));
  MUONSHARD_ASSIGN_OR_RETURN(v1::RankView view, planner::ExtractRankView(plan.plan, rank));
  return VersionedRankView{plan.version, std::move(view)};
}

}  // namespace muonshard::client
