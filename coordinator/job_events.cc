#include "coordinator/job_events.h"

#include <memory>
#include <vector>

#include "common/status_macros.h"

namespace muonshard::coordinator {

void JobEvents::Emit(Job& job, v1::JobEventType type, const v1::WorkerStatus* worker, const std::string& reason,
                     Effects& effects) {
  v1::JobEvent& e = job.history.events.emplace_back();
  e.set_job(job.name);
  e.set_revision(++job.history.revision);
  e.set_type(type);
  e.set_generation(job.generation);
  e.set_plan_version(job.roster.plan_version());
  e.set_world_size(job.roster.world_size());
  if (worker != nullptr) *e.mutable_worker() = *worker;
  e.set_reason(reason);
  e.set_time_micros(absl::ToUnixMicros(clock_->Now()));
  observer_->OnJobEvent(e, job.roster.counts());
  AnnouncePlan(job);
  while (static_cast<int64_t>(job.history.events.size()) > options_->job_event_history) {
    job.history.events.pop_front();
  }
  effects.changed_jobs.push_back(job.name);
}

// NOTE [Membership state machine]: a version while a worker is joined, none
// otherwise.
void JobEvents::AnnouncePlan(Job& job) {
  const int64_t running = job.roster.counts().joined > 0 ? job.roster.plan_version() : 0;
  if (running == job.history.announced_plan) return;
  job.history.announced_plan = running;
  if (running == 0) {
    observer_->OnJobPlanEnded(job.name);
    return;
  }
  v1::PlanVersionInfo info = catalog_->Info(running).value_or(v1::PlanVersionInfo());
  info.set_version(running);
  absl::StatusOr<std::shared_ptr<const v1::Plan>> plan = catalog_->GetPlan(running);
  observer_->OnJobPlan(job.name, info, plan.ok() ? plan->get() : nullptr);
}

v1::JobStatus JobEvents::StatusOf(const Job& job) const {
  v1::JobStatus s;
  s.set_job(job.name);
  s.set_generation(job.generation);
  s.set_plan_version(job.roster.plan_version());
  s.set_world_size(job.roster.world_size());
  s.set_revision(job.history.revision);
  s.set_min_workers(job.elastic.min_workers);
  s.set_max_world_size(job.elastic.max_world_size);
  s.set_resize_error(job.elastic.resize_error);
  s.set_generation_reason(job.generation_reason);
  if (job.failure.has_value()) *s.mutable_failure() = *job.failure;
  for (const std::optional<v1::WorkerStatus>& slot : job.roster.slots()) {
    if (slot.has_value()) *s.add_workers() = *slot;
  }
  return s;
}

absl::StatusOr<v1::ListWorkersResponse> JobEvents::ListWorkers(const std::string& job) const {
  v1::ListWorkersResponse r;
  if (!job.empty()) {
    MUONSHARD_ASSIGN_OR_RETURN(Job * j, table_->Find(job));
    *r.add_jobs() = StatusOf(*j);
    return r;
  }
  for (const Job* j : table_->Sorted()) *r.add_jobs() = StatusOf(*j);
  return r;
}

v1::JobEvent JobEvents::Snapshot(const std::string& name, const Job* job) const {
  v1::JobEvent e;
  e.set_job(name);
  e.set_type(v1::JOB_EVENT_SNAPSHOT);
  e.set_time_micros(absl::ToUnixMicros(clock_->Now()));
  if (job == nullptr) return e;  // revision 0: the job does not exist yet
  v1::JobStatus s = StatusOf(*job);
  e.set_revision(job->history.revision);
  e.set_generation(job->generation);
  e.set_plan_version(job->roster.plan_version());
  e.set_world_size(job->roster.world_size());
  e.mutable_workers()->Swap(s.mutable_workers());
  return e;
}

std::optional<v1::JobEvent> JobEvents::NextEvent(const std::string& job, std::optional<int64_t> cursor) const {
  const Job* j = table_->FindOrNull(job);
  if (j == nullptr) {
    if (cursor == 0) return std::nullopt;  // has seen the empty snapshot
    return Snapshot(job, nullptr);
  }
  if (!cursor.has_value()) return Snapshot(job, j);
  const EventHistory& h = j->history;
  if (*cursor == h.revision) return std::nullopt;
  const int64_t first = h.events.empty() ? h.revision + 1 : h.events.front().revision();
  int64_t c = *cursor;
  // Saw the job before it existed: replay it from its start if still held.
  if (c == 0 && first == h.base_revision + 1) c = h.base_revision;
  if (c >= first - 1 && c < h.revision) return h.events[static_cast<size_t>(c + 1 - first)];
  return Snapshot(job, j);
}

}  // namespace muonshard::coordinator
