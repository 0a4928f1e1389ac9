#include "coordinator/generation_tracker.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::coordinator {
namespace {

// ReportError keeps this much of a worker's message (BoundMessage).
constexpr size_t kMaxReportBytes = 1024;

// A reported code as a failure's: an error code (UNKNOWN for OK or a number
// that is not a code).
int32_t FailureCode(int32_t reported) {
  const auto code = static_cast<absl::StatusCode>(reported);
  const bool known = reported > 0 && reported <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated);
  return static_cast<int32_t>(known ? code : absl::StatusCode::kUnknown);
}

// Whether `w` reported `failure` (its own error needs no translation).
bool IsFailureOf(const v1::JobFailure& failure, const v1::WorkerStatus& w) {
  return failure.rank() == w.rank() && failure.host() == w.host() && failure.device() == w.device();
}

}  // namespace

absl::Status FailureStatus(const v1::JobFailure& failure) {
  return absl::Status(static_cast<absl::StatusCode>(failure.code()), failure.reason());
}

std::string BoundMessage(const std::string& message) {
  if (message.size() <= kMaxReportBytes) return message;
  size_t end = kMaxReportBytes;
  while (end > 0 && (static_cast<unsigned char>(message[end]) & 0xC0) == 0x80) --end;
  return absl::StrCat(message.substr(0, end), "… (truncated from ", message.size(), " bytes)");
}

absl::StatusOr<Job*> GenerationTracker::StartJob(const std::string& name) {
  MUONSHARD_RETURN_IF_ERROR(table_->CheckRoom());
  MUONSHARD_ASSIGN_OR_RETURN(int64_t last, store_->LoadGeneration(name));
  MUONSHARD_RETURN_IF_ERROR(store_->SaveGeneration(name, last + 1));
  return table_->Add(name, last + 1, (last + 1) * kRevisionBase,
                     last == 0 ? "new job"
                               : absl::StrCat("first join since the coordinator started (generation ", last,
                                              " was the last one persisted)"));
}

absl::StatusOr<int64_t> GenerationTracker::LastPersisted(const std::string& job) { return store_->LoadGeneration(job); }

void GenerationTracker::Bump(Job& job, const std::string& reason, Effects& effects) {
  ++job.generation;
  std::string why = reason;
  if (absl::Status s = store_->SaveGeneration(job.name, job.generation); !s.ok()) {
    // The group must re-form either way; a restart may repeat this number.
    absl::StrAppend(&why, " (generation not persisted: ", s.message(), ")");
  }
  job.generation_reason = why;
  job.moved_at = clock_->Now();
  // Everyone joins the new generation afresh: nobody is left to adopt.
  job.adopting_until.reset();
  // A failed job's waits end with its failure (NOTE [Job failure]).
  job.kv->AbortAll(job.failure.has_value()
                       ? FailureStatus(*job.failure)
                       : absl::AbortedError(
                             absl::StrCat("job \"", job.name, "\" moved to generation ", job.generation, ": ", reason)),
                   &effects.completions);
  job.kv = std::make_unique<RendezvousKv>(options_);
  events_->Emit(job, v1::JOB_EVENT_GENERATION_CHANGED, nullptr, why, effects);
}

absl::StatusOr<v1::ReportErrorResponse> GenerationTracker::Report(const v1::ReportErrorRequest& request,
                                                                  const std::string& message, Effects& effects) {
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, table_->Find(request.job()));
  MUONSHARD_ASSIGN_OR_RETURN(v1::WorkerStatus * w, job->roster.Find(request.rank(), request.incarnation()));
  events_->Emit(*job, v1::JOB_EVENT_ERROR_REPORTED, w, message, effects);
  if (request.ends_job() && !job->failure.has_value() && w->state() == v1::WORKER_STATE_JOINED) {
    Fail(*job, *w, request, message, effects);
  } else if (request.generation() == job->generation && MemberOf(*w, job->generation)) {
    // Only a member's report for the running generation breaks the group;
    // an older one arrives after the group has already moved on.
    Bump(*job, absl::StrCat(Describe(*w), " reported: ", message.empty() ? "(no message)" : message), effects);
  }
  v1::ReportErrorResponse r;
  r.set_generation(job->generation);
  r.set_generation_reason(job->generation_reason);
  if (job->failure.has_value() && !IsFailureOf(*job->failure, *w)) *r.mutable_failure() = *job->failure;
  return r;
}

// NOTE [Job failure]: the job ends with `worker`'s error; its generation
// moves so that every wait, heartbeat and join of the old one returns it.
void GenerationTracker::Fail(Job& job, const v1::WorkerStatus& worker, const v1::ReportErrorRequest& request,
                             const std::string& message, Effects& effects) {
  v1::JobFailure& f = job.failure.emplace();
  f.set_rank(worker.rank());
  f.set_host(worker.host());
  f.set_device(worker.device());
  f.set_generation(request.generation());
  f.set_code(FailureCode(request.code()));
  f.set_reason(absl::StrCat(Describe(worker), " failed: ", message.empty() ? "(no message)" : message));
  f.set_time_micros(absl::ToUnixMicros(clock_->Now()));
  Bump(job, f.reason(), effects);
}

absl::Status GenerationTracker::CheckHeartbeat(const Job& job, const v1::WorkerStatus& worker,
                                               int64_t generation) const {
  if (generation == job.generation && worker.generation() == job.generation) return absl::OkStatus();
  if (job.failure.has_value()) return FailureStatus(*job.failure);
  // The reason (bounded: a reported message is cut to kMaxReportBytes)
  // tells the survivors why they restart.
  const std::string& why = job.generation_reason;
  return absl::AbortedError(absl::StrCat("generation ", generation, " of job \"", job.name,
                                         "\" is stale; the job is at generation ", job.generation,
                                         why.empty() ? "" : absl::StrCat(" (", why, ")"), ": join again"));
}

absl::Status GenerationTracker::CheckKeys(const Job& job, int64_t generation) const {
  if (generation == job.generation) return absl::OkStatus();
  if (job.failure.has_value()) return FailureStatus(*job.failure);
  const std::string& why = job.generation_reason;
  return absl::AbortedError(absl::StrCat("generation ", generation, " is not job \"", job.name,
                                         "\"'s current generation ", job.generation,
                                         why.empty() ? "" : absl::StrCat(" (", why, ")")));
}

}  // namespace muonshard::coordinator
