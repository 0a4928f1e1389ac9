#include "coordinator/job_adoption.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace muonshard::coordinator {
namespace {

constexpr char kAdoptedReason[] = "adopted after a coordinator restart";

}  // namespace

// How long an adopted job waits for its ranks: their heartbeats come every
// third of the timeout, and their channels find the restarted coordinator
// within about a second (CoordinatorClient's reconnect backoff), which under
// load can take most of one timeout: two leave room.
absl::Duration JobAdoption::Grace() const { return 2 * p_.options->heartbeat_timeout; }

absl::StatusOr<v1::JoinJobResponse> JobAdoption::Adopt(const v1::JoinJobRequest& request, Effects& effects) {
  Job* job = p_.table->FindOrNull(request.job());
  if (job == nullptr) {
    MUONSHARD_ASSIGN_OR_RETURN(job, AdoptJob(request));
  } else if (job->failure.has_value()) {
    // A failure whose code reads as "membership unknown" (NOT_FOUND,
    // FAILED_PRECONDITION) sends a heartbeat here: it gets the failure too.
    return FailureStatus(*job->failure);
  } else if (job->generation != request.adopt_generation() || job->roster.plan_version() != request.plan_version()) {
    return absl::AbortedError(absl::StrCat("job \"", job->name, "\" is at generation ", job->generation,
                                           " (plan version ", job->roster.plan_version(), "); cannot adopt generation ",
                                           request.adopt_generation(), " (plan version ", request.plan_version(),
                                           "): join again"));
  }
  MUONSHARD_RETURN_IF_ERROR(AdoptRank(*job, request, effects));
  return p_.membership->JoinResponse(*job, request.rank());
}

// Re-creates a job this process does not know at the generation its workers
// run, when that is the last one persisted (a later one was handed out, so
// the group the adopter belongs to has been replaced).
absl::StatusOr<Job*> JobAdoption::AdoptJob(const v1::JoinJobRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(p_.table->CheckRoom());
  MUONSHARD_ASSIGN_OR_RETURN(int64_t last, p_.generations->LastPersisted(request.job()));
  if (last != request.adopt_generation()) {
    return absl::AbortedError(absl::StrCat("job \"", request.job(), "\"'s last persisted generation is ", last,
                                           "; cannot adopt generation ", request.adopt_generation(), ": join again"));
  }
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanVersionInfo info, p_.catalog->Info(request.plan_version()));
  MUONSHARD_RETURN_IF_ERROR(CheckRank(request.job(), request.rank(), info.topology().world_size()));
  // The previous process may have started from this very generation, so its
  // revisions may lie above last x kRevisionBase: the clock separates them.
  const absl::Time now = p_.clock->Now();
  Job* job =
      p_.table->Add(request.job(), last, std::max(last * kRevisionBase, absl::ToUnixMicros(now)), kAdoptedReason);
  job->roster.SetPlan(info);
  job->adopting_until = now + Grace();
  return job;
}

// Gives the adopter its rank in the job's current generation; idempotent for
// the incarnation holding it (an answer may have been lost).
absl::Status JobAdoption::AdoptRank(Job& job, const v1::JoinJobRequest& request, Effects& effects) {
  const int rank = request.rank();
  MUONSHARD_RETURN_IF_ERROR(CheckRank(job.name, rank, job.roster.world_size()));
  if (v1::WorkerStatus* holder = job.roster.Holder(rank)) {
    if (holder->incarnation() != request.incarnation()) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", rank, " of job \"", job.name, "\" is held by ", Describe(*holder)));
    }
    if (!MemberOf(*holder, job.generation)) {
      return absl::AbortedError(absl::StrCat(Describe(*holder), " of job \"", job.name, "\" joined generation ",
                                             holder->generation(), ", not ", job.generation, ": join again"));
    }
    holder->set_last_heartbeat_micros(absl::ToUnixMicros(p_.clock->Now()));
    return absl::OkStatus();
  }
  const v1::WorkerStatus* joined = job.roster.JoinedAt(request.host(), request.device());
  if (joined != nullptr && joined->rank() != rank) {
    return absl::FailedPreconditionError(absl::StrCat(request.host(), "/", request.device(), " already joined job \"",
                                                      job.name, "\" as rank ", joined->rank(), ", not ", rank));
  }
  p_.membership->Assign(job, rank, request, kAdoptedReason, effects);
  return absl::OkStatus();
}

// At the end of the adoption grace, a rank that has not re-registered did
// not survive the coordinator's restart: its group is broken.
bool JobAdoption::EndAdoption(Job& job, absl::Time now, Effects& effects) {
  if (!job.adopting_until.has_value() || now < *job.adopting_until) return false;
  job.adopting_until.reset();
  std::vector<int> missing;
  for (int r = 0; r < job.roster.world_size(); ++r) {
    if (!job.roster.IsMember(r, job.generation)) missing.push_back(r);
  }
  if (missing.empty()) return false;
  p_.generations->Bump(
      job,
      absl::StrCat(missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "),
                   " did not re-register within ", absl::FormatDuration(Grace()), " of the coordinator's restart"),
      effects);
  return true;
}

}  // namespace muonshard::coordinator
