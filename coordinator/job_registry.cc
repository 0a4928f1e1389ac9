#include "coordinator/job_registry.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::coordinator {

JobRegistry::JobRegistry(PlanStore* store, PlanCatalog* catalog, Clock* clock, const CoordinatorOptions& options,
                         CoordinatorObserver* observer, ChangeHook on_change)
    : catalog_(catalog),
      clock_(clock),
      options_(options),
      on_change_(std::move(on_change)),
      table_(&options_),
      events_(&table_, catalog, clock, &options_, observer),
      generations_(&table_, &events_, store, clock, &options_),
      rendezvous_(&table_, &generations_, clock, &options_),
      resizer_(&table_, &generations_, clock, &options_),
      membership_({&table_, &events_, &generations_, &resizer_, catalog, clock, &options_}),
      adoption_({&table_, &generations_, &membership_, catalog, clock, &options_}) {}

JobRegistry::~JobRegistry() = default;

void JobRegistry::Flush(Effects& effects) {
  for (WaitCompletion& c : effects.completions) c.callback(std::move(c.result));
  absl::flat_hash_set<std::string> seen;
  for (const std::string& job : effects.changed_jobs) {
    if (seen.insert(job).second) on_change_(job);
  }
}

// ---------------------------------------------------------------- membership

absl::StatusOr<v1::JoinJobResponse> JobRegistry::Join(const v1::JoinJobRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckJoinRequest(request));
  Effects effects;
  absl::StatusOr<v1::JoinJobResponse> response;
  std::optional<Resize> grow;
  {
    absl::MutexLock lock(&mu_);
    response =
        request.adopt_generation() > 0 ? adoption_.Adopt(request, effects) : membership_.Join(request, effects, &grow);
  }
  if (grow.has_value()) response = Grow(*grow, request, effects);
  // Even a failed join may have failed a restarted worker's old entry.
  Flush(effects);
  return response;
}

absl::StatusOr<v1::HeartbeatResponse> JobRegistry::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  return membership_.Heartbeat(request);
}

absl::StatusOr<v1::LeaveJobResponse> JobRegistry::Leave(const v1::LeaveJobRequest& request) {
  Effects effects;
  absl::StatusOr<v1::LeaveJobResponse> response;
  {
    absl::MutexLock lock(&mu_);
    response = membership_.Leave(request, effects);
  }
  Flush(effects);
  return response;
}

absl::StatusOr<v1::ReportErrorResponse> JobRegistry::ReportError(const v1::ReportErrorRequest& request) {
  const std::string message = BoundMessage(request.message());
  Effects effects;
  absl::StatusOr<v1::ReportErrorResponse> response;
  {
    absl::MutexLock lock(&mu_);
    response = generations_.Report(request, message, effects);
  }
  Flush(effects);
  return response;
}

absl::StatusOr<v1::ListWorkersResponse> JobRegistry::ListWorkers(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  return events_.ListWorkers(job);
}

void JobRegistry::CheckHeartbeats() {
  Effects effects;
  std::vector<Resize> shrinks;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    for (const auto& [name, job] : table_.jobs()) {
      // A pass that moved the generation ended any adoption with it.
      if (!membership_.ExpireWorkers(*job, now, effects)) adoption_.EndAdoption(*job, now, effects);
      if (std::optional<Resize> r = resizer_.ShrinkCandidate(*job, now)) shrinks.push_back(*std::move(r));
    }
  }
  Flush(effects);
  for (const Resize& r : shrinks) Shrink(r);
}

// ---------------------------------------------------------------- elastic

void JobRegistry::Shrink(const Resize& resize) {
  absl::StatusOr<v1::PlanVersionInfo> info = PlanResize(*catalog_, resize);
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    resizer_.FinishShrink(resize, info, effects);
  }
  Flush(effects);
}

absl::StatusOr<v1::JoinJobResponse> JobRegistry::Grow(const Resize& resize, const v1::JoinJobRequest& request,
                                                      Effects& effects) {
  absl::StatusOr<v1::PlanVersionInfo> info = PlanResize(*catalog_, resize);
  if (!info.ok()) {
    return Annotate(info.status(), absl::StrCat("job \"", resize.job, "\" is full; ", resize.reason));
  }
  absl::MutexLock lock(&mu_);
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, resizer_.FinishGrow(resize, *info, effects));
  const int rank = static_cast<int>(resize.keep.size());  // the first new rank; the others take the rest
  membership_.Assign(*job, rank, request, "grew the job", effects);
  return membership_.JoinResponse(*job, rank);
}

// ---------------------------------------------------------------- rendezvous

absl::Status JobRegistry::SetKey(const v1::SetKeyRequest& request) {
  Effects effects;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = rendezvous_.Set(request, effects);
  }
  Flush(effects);
  return status;
}

absl::StatusOr<v1::GetKeyResponse> JobRegistry::GetKey(const v1::GetKeyRequest& request) const {
  absl::MutexLock lock(&mu_);
  return rendezvous_.Get(request);
}

absl::StatusOr<JobRegistry::WaitStarted> JobRegistry::WaitKeys(const v1::WaitKeysRequest& request,
                                                               WaitCallback callback) {
  MUONSHARD_ASSIGN_OR_RETURN(JobRendezvous::WaitSpec spec, JobRendezvous::CheckWait(request, options_));
  absl::MutexLock lock(&mu_);
  return rendezvous_.Wait(request, std::move(spec), std::move(callback));
}

bool JobRegistry::CancelWait(uint64_t id) {
  absl::MutexLock lock(&mu_);
  return rendezvous_.Cancel(id);
}

void JobRegistry::ExpireWaits() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    rendezvous_.ExpireBefore(clock_->Now(), effects);
  }
  Flush(effects);
}

void JobRegistry::Shutdown() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    rendezvous_.Shutdown(effects);
  }
  Flush(effects);
}

// ---------------------------------------------------------------- watch

std::optional<v1::JobEvent> JobRegistry::NextEvent(const std::string& job, std::optional<int64_t> cursor) const {
  absl::MutexLock lock(&mu_);
  return events_.NextEvent(job, cursor);
}

}  // namespace muonshard::coordinator
