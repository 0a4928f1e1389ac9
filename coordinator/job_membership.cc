#include "coordinator/job_membership.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace muonshard::coordinator {
namespace {

constexpr size_t kMaxNameBytes = 256;

absl::Status CheckName(absl::string_view what, const std::string& value) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (value.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", value.size(), " bytes; the limit is ", kMaxNameBytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJoinRequest(const v1::JoinJobRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckName("job", request.job()));
  MUONSHARD_RETURN_IF_ERROR(CheckName("host", request.host()));
  if (request.has_rank() && request.rank() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", request.rank(), " is negative"));
  }
  if (request.plan_version() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("plan version ", request.plan_version(), " is negative"));
  }
  if (request.adopt_generation() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("adopt_generation ", request.adopt_generation(), " is negative"));
  }
  if (request.adopt_generation() == 0) return absl::OkStatus();
  // An adopter says exactly what it runs: the coordinator has nothing to pick.
  if (!request.has_rank()) {
    return absl::InvalidArgumentError("adopt_generation needs rank (the rank the worker runs)");
  }
  if (request.plan_version() == 0) {
    return absl::InvalidArgumentError("adopt_generation needs plan_version (the version the worker runs)");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- join

absl::StatusOr<v1::JoinJobResponse> JobMembership::Join(const v1::JoinJobRequest& request, Effects& effects,
                                                        std::optional<ElasticResizer::Resize>* grow) {
  Job* job = p_.table->FindOrNull(request.job());
  MUONSHARD_RETURN_IF_ERROR(AdmitPlan(job, request));
  MUONSHARD_ASSIGN_OR_RETURN(std::optional<int> rejoined, Rejoin(*job, request, effects));
  if (rejoined.has_value()) return JoinResponse(*job, *rejoined);
  absl::StatusOr<int> picked = job->roster.Pick(request);
  if (!picked.ok() && job->roster.full() && !request.has_rank()) {
    MUONSHARD_ASSIGN_OR_RETURN(*grow, p_.resizer->GrowCandidate(*job, request));
  }
  MUONSHARD_ASSIGN_OR_RETURN(int rank, std::move(picked));
  if (job->adopting_until.has_value()) {
    // The adopted group runs without this newcomer (its rank's old process is
    // gone): the group must re-form, with it.
    p_.generations->Bump(*job,
                         absl::StrCat(request.host(), "/", request.device(), " joined as rank ", rank,
                                      " while the job was being adopted"),
                         effects);
  }
  Assign(*job, rank, request, "", effects);
  return JoinResponse(*job, rank);
}

absl::Status JobMembership::AdmitPlan(Job*& job, const v1::JoinJobRequest& request) {
  if (job != nullptr && job->roster.counts().joined > 0) {
    if (job->failure.has_value()) return FailureStatus(*job->failure);
    const int64_t running = job->roster.plan_version();
    if (request.plan_version() != 0 && request.plan_version() != running &&
        !ElasticResizer::AdmitsOrigin(*job, request.plan_version())) {
      return absl::FailedPreconditionError(absl::StrCat("job \"", job->name, "\" runs plan version ", running,
                                                        "; this worker asked for version ", request.plan_version(),
                                                        " (workers of one job must run the same version)"));
    }
    return absl::OkStatus();
  }
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanVersionInfo info, p_.catalog->Info(request.plan_version()));
  if (job == nullptr) {
    MUONSHARD_ASSIGN_OR_RETURN(job, p_.generations->StartJob(request.job()));
  }
  job->roster.SetPlan(info);
  job->failure.reset();  // a new run of the job
  p_.resizer->Start(*job, request, info);
  job->moved_at = p_.clock->Now();
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int>> JobMembership::Rejoin(Job& job, const v1::JoinJobRequest& request,
                                                         Effects& effects) {
  v1::WorkerStatus* w = job.roster.JoinedAt(request.host(), request.device());
  if (w == nullptr) return std::nullopt;
  if (w->incarnation() != request.incarnation()) {
    FailWorker(job, *w, "restarted (new incarnation)", effects);
    return std::nullopt;
  }
  if (request.has_rank() && request.rank() != w->rank()) {
    return absl::FailedPreconditionError(absl::StrCat(request.host(), "/", request.device(), " already joined job \"",
                                                      job.name, "\" as rank ", w->rank(), ", not ", request.rank()));
  }
  w->set_last_heartbeat_micros(absl::ToUnixMicros(p_.clock->Now()));
  if (w->generation() != job.generation) {
    // A survivor of a failure moves into the new generation.
    w->set_generation(job.generation);
    p_.events->Emit(job, v1::JOB_EVENT_WORKER_JOINED, w, "rejoined", effects);
  }
  return w->rank();
}

void JobMembership::Assign(Job& job, int rank, const v1::JoinJobRequest& request, const std::string& reason,
                           Effects& effects) {
  v1::WorkerStatus& w = job.roster.Place(rank, request, job.generation, p_.clock->Now());
  p_.events->Emit(job, v1::JOB_EVENT_WORKER_JOINED, &w, reason, effects);
}

v1::JoinJobResponse JobMembership::JoinResponse(const Job& job, int rank) const {
  v1::JoinJobResponse r;
  r.set_rank(rank);
  r.set_world_size(job.roster.world_size());
  r.set_generation(job.generation);
  r.set_plan_version(job.roster.plan_version());
  r.set_content_hash(job.roster.content_hash());
  r.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(p_.options->heartbeat_timeout));
  return r;
}

// ---------------------------------------------------------------- liveness

absl::StatusOr<v1::HeartbeatResponse> JobMembership::Heartbeat(const v1::HeartbeatRequest& request) {
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, p_.table->Find(request.job()));
  MUONSHARD_ASSIGN_OR_RETURN(v1::WorkerStatus * w, job->roster.Find(request.rank(), request.incarnation()));
  if (w->state() != v1::WORKER_STATE_JOINED) {
    return absl::AbortedError(absl::StrCat(Describe(*w), " of job \"", job->name, "\" was marked ",
                                           w->state() == v1::WORKER_STATE_FAILED ? "failed" : "left", "; join again"));
  }
  // Alive, even when about to be told its generation is stale.
  w->set_last_heartbeat_micros(absl::ToUnixMicros(p_.clock->Now()));
  MUONSHARD_RETURN_IF_ERROR(p_.generations->CheckHeartbeat(*job, *w, request.generation()));
  v1::HeartbeatResponse r;
  r.set_generation(job->generation);
  r.set_plan_version(job->roster.plan_version());
  return r;
}

absl::StatusOr<v1::LeaveJobResponse> JobMembership::Leave(const v1::LeaveJobRequest& request, Effects& effects) {
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, p_.table->Find(request.job()));
  MUONSHARD_ASSIGN_OR_RETURN(v1::WorkerStatus * w, job->roster.Find(request.rank(), request.incarnation()));
  if (w->state() != v1::WORKER_STATE_LEFT) {
    const bool was_member = MemberOf(*w, job->generation);
    job->roster.SetState(*w, v1::WORKER_STATE_LEFT);
    p_.events->Emit(*job, v1::JOB_EVENT_WORKER_LEFT, w, "", effects);
    if (was_member) p_.generations->Bump(*job, absl::StrCat(Describe(*w), " left"), effects);
  }
  v1::LeaveJobResponse r;
  r.set_generation(job->generation);
  return r;
}

void JobMembership::FailWorker(Job& job, v1::WorkerStatus& worker, const std::string& why, Effects& effects) {
  job.roster.SetState(worker, v1::WORKER_STATE_FAILED);
  p_.events->Emit(job, v1::JOB_EVENT_WORKER_FAILED, &worker, why, effects);
  if (worker.generation() == job.generation) {
    p_.generations->Bump(job, absl::StrCat(Describe(worker), " ", why), effects);
  }
}

bool JobMembership::ExpireWorkers(Job& job, absl::Time now, Effects& effects) {
  std::vector<std::string> lost;
  for (v1::WorkerStatus* w : job.roster.Joined()) {
    const absl::Duration silent = now - absl::FromUnixMicros(w->last_heartbeat_micros());
    if (silent <= p_.options->heartbeat_timeout) continue;
    job.roster.SetState(*w, v1::WORKER_STATE_FAILED);
    p_.events->Emit(job, v1::JOB_EVENT_WORKER_FAILED, w,
                    absl::StrCat("no heartbeat for ", absl::FormatDuration(silent)), effects);
    if (w->generation() == job.generation) lost.push_back(Describe(*w));
  }
  if (lost.empty()) return false;
  // One bump for everything found in this pass (it ends an adoption too): the
  // group re-forms once.
  p_.generations->Bump(job,
                       absl::StrCat(absl::StrJoin(lost, ", "), " missed heartbeats for ",
                                    absl::FormatDuration(p_.options->heartbeat_timeout)),
                       effects);
  return true;
}

}  // namespace muonshard::coordinator
