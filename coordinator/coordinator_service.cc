#include "coordinator/coordinator_service.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::coordinator {
namespace {

constexpr int kDefaultPageSize = 1000;
constexpr int kMaxPageSize = 10000;

}  // namespace

// A watcher's registration. `wake` is called with `mu` held, so clearing it
// under `mu` (Unsubscribe) waits for a running call to end.
struct Watcher::Slot {
  explicit Slot(std::string j, std::function<void()> w) : job(std::move(j)), wake(std::move(w)) {}
  const std::string job;
  absl::Mutex mu;
  std::function<void()> wake ABSL_GUARDED_BY(mu);
};

Watcher::~Watcher() { service_->Unsubscribe(id_); }

absl::StatusOr<std::optional<v1::WatchEvent>> Watcher::Next() {
  std::vector<v1::PlanVersionInfo> next = service_->catalog_.After(plan_cursor_, 1);
  if (!next.empty()) {
    plan_cursor_ = next.front().version();
    v1::WatchEvent event;
    *event.mutable_plan() = std::move(next.front());
    return event;
  }
  if (!job_.empty()) {
    if (std::optional<v1::JobEvent> e = service_->jobs_.NextEvent(job_, job_cursor_)) {
      job_cursor_ = e->revision();
      v1::WatchEvent event;
      *event.mutable_job() = *std::move(e);
      return event;
    }
  }
  if (service_->shut_down_.load()) {
    return absl::UnavailableError(
        absl::StrCat("coordinator is shutting down; reconnect with from_version ", plan_cursor_));
  }
  return std::nullopt;
}

CoordinatorService::CoordinatorService(PlanStore* store, Clock* clock, const CoordinatorOptions& options,
                                       CoordinatorObserver* observer)
    : options_(options),
      observer_(observer),
      catalog_(store, clock, options, observer),
      jobs_(store, &catalog_, clock, options, observer, [this](const std::string& job) { Wake(job); }) {}

absl::StatusOr<std::unique_ptr<CoordinatorService>> CoordinatorService::Create(PlanStore* store, Clock* clock,
                                                                               const CoordinatorOptions& options,
                                                                               CoordinatorObserver* observer) {
  std::unique_ptr<CoordinatorService> service(new CoordinatorService(store, clock, options, observer));
  MUONSHARD_RETURN_IF_ERROR(Annotate(service->catalog_.Load(), "loading plan versions"));
  return service;
}

absl::Status CoordinatorService::CheckServing() const {
  if (shut_down_.load()) return absl::UnavailableError("coordinator is shutting down");
  return absl::OkStatus();
}

// ---------------------------------------------------------------- plans

absl::StatusOr<v1::SubmitPlanResponse> CoordinatorService::SubmitPlan(const v1::SubmitPlanRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckServing());
  MUONSHARD_ASSIGN_OR_RETURN(v1::SubmitPlanResponse response, catalog_.Submit(request.request()));
  if (response.created()) Wake("");
  return response;
}

absl::StatusOr<SerializedPieces> CoordinatorService::GetPlanBytes(const v1::GetPlanRequest& request) {
  std::optional<int> rank;
  if (request.has_rank()) rank = request.rank();
  return catalog_.GetResponse(request.version(), rank, request.with_request());
}

absl::StatusOr<v1::GetPlanResponse> CoordinatorService::GetPlan(const v1::GetPlanRequest& request) {
  MUONSHARD_ASSIGN_OR_RETURN(SerializedPieces pieces, GetPlanBytes(request));
  v1::GetPlanResponse response;
  if (!response.ParseFromString(Concatenate(pieces))) {
    return absl::InternalError("unparsable cached response");
  }
  return response;
}

absl::StatusOr<v1::ListPlansResponse> CoordinatorService::ListPlans(const v1::ListPlansRequest& request) const {
  if (request.after_version() < 0 || request.page_size() < 0) {
    return absl::InvalidArgumentError("after_version and page_size must not be negative");
  }
  const int page = request.page_size() == 0 ? kDefaultPageSize : std::min(request.page_size(), kMaxPageSize);
  std::vector<v1::PlanVersionInfo> versions = catalog_.After(request.after_version(), page + 1);
  v1::ListPlansResponse response;
  response.set_latest_version(catalog_.latest_version());
  if (static_cast<int>(versions.size()) > page) {
    versions.pop_back();
    response.set_next_after_version(versions.back().version());
  }
  for (v1::PlanVersionInfo& v : versions) *response.add_versions() = std::move(v);
  return response;
}

absl::StatusOr<v1::DiffPlansResponse> CoordinatorService::DiffPlans(const v1::DiffPlansRequest& request) {
  if (request.from_version() <= 0) {
    return absl::InvalidArgumentError("from_version is required (a version >= 1)");
  }
  if (request.limit() < 0) return absl::InvalidArgumentError("limit must not be negative");
  v1::DiffPlansResponse response;
  MUONSHARD_ASSIGN_OR_RETURN(*response.mutable_diff(),
                             catalog_.Diff(request.from_version(), request.to_version(), request.limit()));
  return response;
}

// ---------------------------------------------------------------- watch

absl::StatusOr<std::unique_ptr<Watcher>> CoordinatorService::Watch(const v1::WatchRequest& request,
                                                                   std::function<void()> wake) {
  MUONSHARD_RETURN_IF_ERROR(CheckServing());
  const int64_t latest = catalog_.latest_version();
  int64_t plan_cursor = std::max<int64_t>(latest - 1, 0);  // unset: start with the latest
  if (request.has_from_version()) {
    plan_cursor = request.from_version();
    if (plan_cursor < 0) return absl::InvalidArgumentError("from_version is negative");
    if (plan_cursor > latest) {
      return absl::OutOfRangeError(
          absl::StrCat("from_version ", plan_cursor, " is newer than the latest version ", latest));
    }
  }
  if (request.from_job_revision() < 0) {
    return absl::InvalidArgumentError("from_job_revision is negative");
  }
  std::optional<int64_t> job_cursor;
  if (request.from_job_revision() > 0) job_cursor = request.from_job_revision();

  int64_t count = 0;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&watch_mu_);
    if (static_cast<int64_t>(watchers_.size()) >= options_.max_watchers) {
      return absl::ResourceExhaustedError(absl::StrCat(watchers_.size(), " watch streams are open; the limit is ",
                                                       options_.max_watchers, " (--max-watchers)"));
    }
    id = next_watcher_id_++;
    watchers_[id] = std::make_shared<Watcher::Slot>(request.job(), std::move(wake));
    count = static_cast<int64_t>(watchers_.size());
  }
  observer_->OnWatchers(count);
  return std::unique_ptr<Watcher>(new Watcher(this, id, request.job(), plan_cursor, job_cursor));
}

void CoordinatorService::Unsubscribe(uint64_t id) {
  std::shared_ptr<Watcher::Slot> slot;
  int64_t count = 0;
  {
    absl::MutexLock lock(&watch_mu_);
    auto it = watchers_.find(id);
    if (it == watchers_.end()) return;
    slot = std::move(it->second);
    watchers_.erase(it);
    count = static_cast<int64_t>(watchers_.size());
  }
  {
    absl::MutexLock lock(&slot->mu);
    slot->wake = nullptr;
  }
  observer_->OnWatchers(count);
}

void CoordinatorService::Wake(const std::string& job) {
  std::vector<std::shared_ptr<Watcher::Slot>> slots;
  {
    absl::MutexLock lock(&watch_mu_);
    slots.reserve(watchers_.size());
    for (const auto& [id, slot] : watchers_) {
      if (job.empty() || slot->job == job) slots.push_back(slot);
    }
  }
  for (const std::shared_ptr<Watcher::Slot>& slot : slots) {
    absl::MutexLock lock(&slot->mu);
    if (slot->wake) slot->wake();
  }
}

// ---------------------------------------------------------------- membership

absl::StatusOr<v1::JoinJobResponse> CoordinatorService::JoinJob(const v1::JoinJobRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckServing());
  return jobs_.Join(request);
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorService::Heartbeat(const v1::HeartbeatRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckServing());
  return jobs_.Heartbeat(request);
}

absl::StatusOr<v1::LeaveJobResponse> CoordinatorService::LeaveJob(const v1::LeaveJobRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckServing());
  return jobs_.Leave(request);
}

absl::StatusOr<v1::ReportErrorResponse> CoordinatorService::ReportError(const v1::ReportErrorRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckServing());
  return jobs_.ReportError(request);
}

absl::StatusOr<v1::ListWorkersResponse> CoordinatorService::ListWorkers(const v1::ListWorkersRequest& request) const {
  return jobs_.ListWorkers(request.job());
}

absl::Status CoordinatorService::SetKey(const v1::SetKeyRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckServing());
  return jobs_.SetKey(request);
}

absl::StatusOr<v1::GetKeyResponse> CoordinatorService::GetKey(const v1::GetKeyRequest& request) const {
  return jobs_.GetKey(request);
}

absl::StatusOr<JobRegistry::WaitStarted> CoordinatorService::WaitKeys(const v1::WaitKeysRequest& request,
                                                                      WaitCallback callback) {
  MUONSHARD_RETURN_IF_ERROR(CheckServing());
  return jobs_.WaitKeys(request, std::move(callback));
}

void CoordinatorService::Shutdown() {
  shut_down_.store(true);
  jobs_.Shutdown();
  Wake("");
}

}  // namespace muonshard::coordinator
