#include "coordinator/job_registry.h"

#include <algorithm>
#include <deque>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/quote.h"
#include "common/status_macros.h"
#include "plan/topology.h"

namespace muonshard::coordinator {
namespace {

// Job revisions of one coordinator process start at generation x kRevisionBase
// (see NOTE [Membership state machine]).
constexpr int64_t kRevisionBase = 1'000'000'000;
constexpr size_t kMaxNameBytes = 256;
// ReportError keeps this much of a worker's message: it travels in events,
// heartbeat answers and ListWorkers, and a stack trace can be megabytes.
constexpr size_t kMaxReportBytes = 1024;
constexpr char kAdoptedReason[] = "adopted after a coordinator restart";

using Identity = std::pair<std::string, std::string>;  // (host, device)

std::string Describe(const v1::WorkerStatus& w) {
  return absl::StrCat("rank ", w.rank(), " (", w.host(), w.device().empty() ? "" : "/", w.device(), ")");
}

// The first kMaxReportBytes of `message`, cut before a UTF-8 continuation
// byte (a proto3 string must stay valid UTF-8) and marked when cut.
std::string BoundMessage(const std::string& message) {
  if (message.size() <= kMaxReportBytes) return message;
  size_t end = kMaxReportBytes;
  while (end > 0 && (static_cast<unsigned char>(message[end]) & 0xC0) == 0x80) --end;
  return absl::StrCat(message.substr(0, end), "… (truncated from ", message.size(), " bytes)");
}

// NOTE [Job failure]: what every rank of a failed job ends with.
absl::Status FailureStatus(const v1::JobFailure& failure) {
  return absl::Status(static_cast<absl::StatusCode>(failure.code()), failure.reason());
}

// A reported code as a failure's: an error code (UNKNOWN for OK or a number
// that is not a code).
int32_t FailureCode(int32_t reported) {
  const auto code = static_cast<absl::StatusCode>(reported);
  const bool known = reported > 0 && reported <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated);
  return static_cast<int32_t>(known ? code : absl::StatusCode::kUnknown);
}

absl::Status CheckRank(const std::string& job, int rank, int world_size) {
  if (rank >= 0 && rank < world_size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", rank, " is outside job \"", job, "\"'s world of ", world_size));
}

absl::Status CheckName(absl::string_view what, const std::string& value) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (value.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", value.size(), " bytes; the limit is ", kMaxNameBytes));
  }
  return absl::OkStatus();
}

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

// A member of `generation`: joined it and neither failed nor left since.
bool MemberOf(const v1::WorkerStatus& w, int64_t generation) {
  return w.state() == v1::WORKER_STATE_JOINED && w.generation() == generation;
}

// Whether `w` reported `failure` (its own error needs no translation).
bool IsFailureOf(const v1::JobFailure& failure, const v1::WorkerStatus& w) {
  return failure.rank() == w.rank() && failure.host() == w.host() && failure.device() == w.device();
}

// Ranks per moe_sharding block of a plan's topology (JobRegistry::Job); a
// stored plan's topology is valid.
int BlockOf(const v1::Topology& t) {
  absl::StatusOr<planner::RankLayout> layout = planner::RankLayout::Create(t);
  return layout.ok() ? layout->ms_block() : 1;
}

}  // namespace

struct JobRegistry::Job {
  std::string name;
  int64_t generation = 0;
  int64_t plan_version = 0;
  std::string content_hash;
  int32_t world_size = 0;
  int64_t base_revision = 0;
  int64_t revision = 0;
  std::deque<v1::JobEvent> history;
  std::vector<std::optional<v1::WorkerStatus>> slots;  // by rank
  std::set<int> free;                                  // ranks without a JOINED worker
  absl::flat_hash_map<Identity, int> by_identity;
  WorkerCounts counts;
  std::unique_ptr<RendezvousKv> kv;
  std::string generation_reason;  // why the job moved to `generation`
  // NOTE [Job failure]: set by the first report that ends the job; cleared
  // when the job starts afresh (a join with no worker joined).
  std::optional<v1::JobFailure> failure;
  // NOTE [Adoption]: set while the job re-created from a restart waits for
  // its running ranks to re-register; the generation moves if one has not.
  std::optional<absl::Time> adopting_until;
  // NOTE [Elastic jobs] (coordinator.proto): 0 = not elastic.
  int min_workers = 0;
  absl::Duration rejoin_grace;
  int max_world_size = 0;           // the world of the plan the job started with
  int64_t origin_plan_version = 0;  // that plan's version
  // Ranks per block of the plan's layout (RankLayout::ms_block, pp * max(ep,
  // tp)): whose pipeline stages, expert and tensor-parallel groups break when
  // one of them is gone. A resize keeps or drops whole blocks.
  int block = 1;
  // Newcomers to a full job with block > 1, waiting to grow it by a block:
  // when each last asked.
  absl::flat_hash_map<Identity, absl::Time> waiting;
  absl::Time moved_at;  // when `generation` began
  std::string resize_error;
  int64_t resize_failed_at = 0;  // the generation a resize could not be planned for
  int64_t announced_plan = 0;    // the version the observer was told it runs (0: none)
};

JobRegistry::JobRegistry(PlanStore* store, PlanCatalog* catalog, Clock* clock, const CoordinatorOptions& options,
                         CoordinatorObserver* observer, ChangeHook on_change)
    : store_(store),
      catalog_(catalog),
      clock_(clock),
      options_(options),
      observer_(observer),
      on_change_(std::move(on_change)) {}

JobRegistry::~JobRegistry() = default;

void JobRegistry::Flush(Effects& effects) {
  for (WaitCompletion& c : effects.completions) c.callback(std::move(c.result));
  absl::flat_hash_set<std::string> seen;
  for (const std::string& job : effects.changed_jobs) {
    if (seen.insert(job).second) on_change_(job);
  }
}

// ---------------------------------------------------------------- jobs

absl::StatusOr<JobRegistry::Job*> JobRegistry::FindJob(const std::string& name) const {
  auto it = jobs_.find(name);
  if (it == jobs_.end())
    // A lookup's name was never length-checked: quote a bounded prefix.
    return absl::NotFoundError(absl::StrCat("job ", QuoteBounded(name), " does not exist"));
  return it->second.get();
}

absl::Status JobRegistry::CheckRoomForJob() const {
  if (static_cast<int64_t>(jobs_.size()) < options_.max_jobs) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("this coordinator already tracks ", jobs_.size(), " jobs (--max-jobs)"));
}

JobRegistry::Job* JobRegistry::AddJob(const std::string& name, int64_t generation, int64_t base_revision,
                                      std::string reason) {
  auto job = std::make_unique<Job>();
  job->name = name;
  job->generation = generation;
  job->generation_reason = std::move(reason);
  job->base_revision = base_revision;
  job->revision = base_revision;
  job->kv = std::make_unique<RendezvousKv>(&options_);
  Job* raw = job.get();
  jobs_[name] = std::move(job);
  return raw;
}

absl::StatusOr<JobRegistry::Job*> JobRegistry::CreateJob(const std::string& name) {
  MUONSHARD_RETURN_IF_ERROR(CheckRoomForJob());
  // The generation is persisted before anyone can see it, so a restarted
  // coordinator never hands it out again.
  MUONSHARD_ASSIGN_OR_RETURN(int64_t last, store_->LoadGeneration(name));
  MUONSHARD_RETURN_IF_ERROR(store_->SaveGeneration(name, last + 1));
  return AddJob(name, last + 1, (last + 1) * kRevisionBase,
                last == 0 ? "new job"
                          : absl::StrCat("first join since the coordinator started (generation ", last,
                                         " was the last one persisted)"));
}

void JobRegistry::ApplyPlan(Job& job, const v1::PlanVersionInfo& info) {
  if (info.version() != job.plan_version) {
    // A new plan (maybe another world size): forget the departed workers.
    job.slots.assign(info.topology().world_size(), std::nullopt);
    job.free.clear();
    for (int r = 0; r < info.topology().world_size(); ++r) job.free.insert(job.free.end(), r);
    job.by_identity.clear();
    job.counts = WorkerCounts();
  }
  job.plan_version = info.version();
  job.content_hash = info.content_hash();
  job.world_size = info.topology().world_size();
  job.block = BlockOf(info.topology());
}

// Creates the job or, when none of its workers is joined, (re)fixes its plan
// version; otherwise checks the joiner asks for the job's version.
absl::Status JobRegistry::AdmitPlan(Job*& job, const v1::JoinJobRequest& request) {
  if (job != nullptr && job->counts.joined > 0) {
    if (job->failure.has_value()) return FailureStatus(*job->failure);
    // An elastic job also admits the version it started with: a process
    // restarted with its first command line after a resize.
    const bool origin = job->min_workers > 0 && request.plan_version() == job->origin_plan_version;
    if (request.plan_version() != 0 && request.plan_version() != job->plan_version && !origin) {
      return absl::FailedPreconditionError(absl::StrCat("job \"", job->name, "\" runs plan version ", job->plan_version,
                                                        "; this worker asked for version ", request.plan_version(),
                                                        " (workers of one job must run the same version)"));
    }
    return absl::OkStatus();
  }
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanVersionInfo info, catalog_->Info(request.plan_version()));
  if (job == nullptr) {
    MUONSHARD_ASSIGN_OR_RETURN(job, CreateJob(request.job()));
  }
  ApplyPlan(*job, info);
  job->failure.reset();  // a new run of the job
  job->min_workers = request.min_workers();
  job->rejoin_grace =
      request.rejoin_grace_ms() > 0 ? absl::Milliseconds(request.rejoin_grace_ms()) : 10 * options_.heartbeat_timeout;
  job->max_world_size = info.topology().world_size();
  job->origin_plan_version = info.version();
  job->moved_at = clock_->Now();
  return absl::OkStatus();
}

// ---------------------------------------------------------------- workers

void JobRegistry::SetState(Job& job, v1::WorkerStatus& worker, v1::WorkerState state) {
  auto count = [&job](v1::WorkerState s) -> int64_t* {
    switch (s) {
      case v1::WORKER_STATE_JOINED:
        return &job.counts.joined;
      case v1::WORKER_STATE_FAILED:
        return &job.counts.failed;
      case v1::WORKER_STATE_LEFT:
        return &job.counts.left;
      default:
        return nullptr;
    }
  };
  if (int64_t* c = count(worker.state())) --*c;
  if (int64_t* c = count(state)) ++*c;
  worker.set_state(state);
  if (state == v1::WORKER_STATE_JOINED) {
    job.free.erase(worker.rank());
  } else {
    job.free.insert(worker.rank());
  }
}

void JobRegistry::Emit(Job& job, v1::JobEventType type, const v1::WorkerStatus* worker, const std::string& reason,
                       Effects& effects) {
  v1::JobEvent& e = job.history.emplace_back();
  e.set_job(job.name);
  e.set_revision(++job.revision);
  e.set_type(type);
  e.set_generation(job.generation);
  e.set_plan_version(job.plan_version);
  e.set_world_size(job.world_size);
  if (worker != nullptr) *e.mutable_worker() = *worker;
  e.set_reason(reason);
  e.set_time_micros(absl::ToUnixMicros(clock_->Now()));
  observer_->OnJobEvent(e, job.counts);
  AnnouncePlan(job);
  while (static_cast<int64_t>(job.history.size()) > options_.job_event_history) {
    job.history.pop_front();
  }
  effects.changed_jobs.push_back(job.name);
}

// Tells the observer when the plan `job` runs changed (NOTE [Membership
// state machine]): a version while a worker is joined, none otherwise.
void JobRegistry::AnnouncePlan(Job& job) {
  const int64_t running = job.counts.joined > 0 ? job.plan_version : 0;
  if (running == job.announced_plan) return;
  job.announced_plan = running;
  if (running == 0) {
    observer_->OnJobPlanEnded(job.name);
    return;
  }
  v1::PlanVersionInfo info = catalog_->Info(running).value_or(v1::PlanVersionInfo());
  info.set_version(running);
  absl::StatusOr<std::shared_ptr<const v1::Plan>> plan = catalog_->GetPlan(running);
  observer_->OnJobPlan(job.name, info, plan.ok() ? plan->get() : nullptr);
}

void JobRegistry::BumpGeneration(Job& job, const std::string& reason, Effects& effects) {
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
  job.kv = std::make_unique<RendezvousKv>(&options_);
  Emit(job, v1::JOB_EVENT_GENERATION_CHANGED, nullptr, why, effects);
}

void JobRegistry::FailWorker(Job& job, v1::WorkerStatus& worker, const std::string& why, Effects& effects) {
  SetState(job, worker, v1::WORKER_STATE_FAILED);
  Emit(job, v1::JOB_EVENT_WORKER_FAILED, &worker, why, effects);
  if (worker.generation() == job.generation) {
    BumpGeneration(job, absl::StrCat(Describe(worker), " ", why), effects);
  }
}

absl::StatusOr<std::optional<int>> JobRegistry::Rejoin(Job& job, const v1::JoinJobRequest& request, Effects& effects) {
  auto it = job.by_identity.find(Identity(request.host(), request.device()));
  if (it == job.by_identity.end()) return std::nullopt;
  v1::WorkerStatus& w = *job.slots[it->second];
  if (w.state() != v1::WORKER_STATE_JOINED) return std::nullopt;
  if (w.incarnation() != request.incarnation()) {
    FailWorker(job, w, "restarted (new incarnation)", effects);
    return std::nullopt;
  }
  if (request.has_rank() && request.rank() != w.rank()) {
    return absl::FailedPreconditionError(absl::StrCat(request.host(), "/", request.device(), " already joined job \"",
                                                      job.name, "\" as rank ", w.rank(), ", not ", request.rank()));
  }
  w.set_last_heartbeat_micros(absl::ToUnixMicros(clock_->Now()));
  if (w.generation() != job.generation) {
    // A survivor of a failure moves into the new generation.
    w.set_generation(job.generation);
    Emit(job, v1::JOB_EVENT_WORKER_JOINED, &w, "rejoined", effects);
  }
  return w.rank();
}

absl::StatusOr<int> JobRegistry::PickRank(const Job& job, const v1::JoinJobRequest& request) const {
  if (request.has_rank()) {
    const int r = request.rank();
    MUONSHARD_RETURN_IF_ERROR(CheckRank(job.name, r, job.world_size));
    if (!(job.free.count(r) > 0)) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", r, " of job \"", job.name, "\" is held by ", Describe(*job.slots[r])));
    }
    return r;
  }
  // A returning (host, device) gets its old rank back when it is free.
  auto it = job.by_identity.find(Identity(request.host(), request.device()));
  if (it != job.by_identity.end() && (job.free.count(it->second) > 0)) return it->second;
  if (job.free.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job.name, "\" is full: all ", job.world_size, " ranks are held"));
  }
  return *job.free.begin();
}

void JobRegistry::Assign(Job& job, int rank, const v1::JoinJobRequest& request, const std::string& reason,
                         Effects& effects) {
  std::optional<v1::WorkerStatus>& slot = job.slots[rank];
  if (slot.has_value()) {
    SetState(job, *slot, v1::WORKER_STATE_UNSPECIFIED);  // uncount the previous holder
    job.by_identity.erase(Identity(slot->host(), slot->device()));
  }
  const int64_t now = absl::ToUnixMicros(clock_->Now());
  slot.emplace();
  slot->set_rank(rank);
  slot->set_host(request.host());
  slot->set_device(request.device());
  slot->set_incarnation(request.incarnation());
  slot->set_generation(job.generation);
  slot->set_join_time_micros(now);
  slot->set_last_heartbeat_micros(now);
  SetState(job, *slot, v1::WORKER_STATE_JOINED);
  job.by_identity[Identity(request.host(), request.device())] = rank;
  Emit(job, v1::JOB_EVENT_WORKER_JOINED, &*slot, reason, effects);
}

v1::JoinJobResponse JobRegistry::JoinResponse(const Job& job, int rank) const {
  v1::JoinJobResponse r;
  r.set_rank(rank);
  r.set_world_size(job.world_size);
  r.set_generation(job.generation);
  r.set_plan_version(job.plan_version);
  r.set_content_hash(job.content_hash);
  r.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(options_.heartbeat_timeout));
  return r;
}

absl::StatusOr<v1::JoinJobResponse> JobRegistry::Join(const v1::JoinJobRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckJoinRequest(request));
  Effects effects;
  absl::StatusOr<v1::JoinJobResponse> response;
  std::optional<Resize> grow;
  {
    absl::MutexLock lock(&mu_);
    response = request.adopt_generation() > 0 ? Adopt(request, effects) : JoinLocked(request, effects, &grow);
  }
  if (grow.has_value()) response = Grow(*grow, request, effects);
  // Even a failed join may have failed a restarted worker's old entry.
  Flush(effects);
  return response;
}

absl::StatusOr<v1::JoinJobResponse> JobRegistry::JoinLocked(const v1::JoinJobRequest& request, Effects& effects,
                                                            std::optional<Resize>* grow) {
  auto it = jobs_.find(request.job());
  Job* job = it == jobs_.end() ? nullptr : it->second.get();
  MUONSHARD_RETURN_IF_ERROR(AdmitPlan(job, request));
  MUONSHARD_ASSIGN_OR_RETURN(std::optional<int> rejoined, Rejoin(*job, request, effects));
  if (rejoined.has_value()) return JoinResponse(*job, *rejoined);
  absl::StatusOr<int> picked = PickRank(*job, request);
  if (!picked.ok() && job->free.empty() && !request.has_rank()) {
    MUONSHARD_ASSIGN_OR_RETURN(*grow, GrowCandidate(*job, request));
  }
  MUONSHARD_ASSIGN_OR_RETURN(int rank, std::move(picked));
  if (job->adopting_until.has_value()) {
    // The adopted group runs without this newcomer (its rank's old process is
    // gone): the group must re-form, with it.
    BumpGeneration(*job,
                   absl::StrCat(request.host(), "/", request.device(), " joined as rank ", rank,
                                " while the job was being adopted"),
                   effects);
  }
  Assign(*job, rank, request, "", effects);
  return JoinResponse(*job, rank);
}

// ---------------------------------------------------------------- adoption

// How long an adopted job waits for its ranks: their heartbeats come every
// third of the timeout, and their channels find the restarted coordinator
// within about a second (CoordinatorClient's reconnect backoff), which under
// load can take most of one timeout: two leave room.
absl::Duration JobRegistry::AdoptionGrace() const { return 2 * options_.heartbeat_timeout; }

absl::StatusOr<v1::JoinJobResponse> JobRegistry::Adopt(const v1::JoinJobRequest& request, Effects& effects) {
  auto it = jobs_.find(request.job());
  Job* job = it == jobs_.end() ? nullptr : it->second.get();
  if (job == nullptr) {
    MUONSHARD_ASSIGN_OR_RETURN(job, AdoptJob(request));
  } else if (job->failure.has_value()) {
    // A failure whose code reads as "membership unknown" (NOT_FOUND,
    // FAILED_PRECONDITION) sends a heartbeat here: it gets the failure too.
    return FailureStatus(*job->failure);
  } else if (job->generation != request.adopt_generation() || job->plan_version != request.plan_version()) {
    return absl::AbortedError(absl::StrCat("job \"", job->name, "\" is at generation ", job->generation,
                                           " (plan version ", job->plan_version, "); cannot adopt generation ",
                                           request.adopt_generation(), " (plan version ", request.plan_version(),
                                           "): join again"));
  }
  MUONSHARD_RETURN_IF_ERROR(AdoptRank(*job, request, effects));
  return JoinResponse(*job, request.rank());
}

// Re-creates a job this process does not know at the generation its workers
// run, when that is the last one persisted (a later one was handed out, so
// the group the adopter belongs to has been replaced).
absl::StatusOr<JobRegistry::Job*> JobRegistry::AdoptJob(const v1::JoinJobRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckRoomForJob());
  MUONSHARD_ASSIGN_OR_RETURN(int64_t last, store_->LoadGeneration(request.job()));
  if (last != request.adopt_generation()) {
    return absl::AbortedError(absl::StrCat("job \"", request.job(), "\"'s last persisted generation is ", last,
                                           "; cannot adopt generation ", request.adopt_generation(), ": join again"));
  }
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanVersionInfo info, catalog_->Info(request.plan_version()));
  MUONSHARD_RETURN_IF_ERROR(CheckRank(request.job(), request.rank(), info.topology().world_size()));
  // The previous process may have started from this very generation, so its
  // revisions may lie above last x kRevisionBase: the clock separates them.
  const absl::Time now = clock_->Now();
  Job* job = AddJob(request.job(), last, std::max(last * kRevisionBase, absl::ToUnixMicros(now)), kAdoptedReason);
  ApplyPlan(*job, info);
  job->adopting_until = now + AdoptionGrace();
  return job;
}

// Gives the adopter its rank in the job's current generation; idempotent for
// the incarnation holding it (an answer may have been lost).
absl::Status JobRegistry::AdoptRank(Job& job, const v1::JoinJobRequest& request, Effects& effects) {
  const int rank = request.rank();
  MUONSHARD_RETURN_IF_ERROR(CheckRank(job.name, rank, job.world_size));
  std::optional<v1::WorkerStatus>& slot = job.slots[rank];
  if (slot.has_value() && slot->state() == v1::WORKER_STATE_JOINED) {
    if (slot->incarnation() != request.incarnation()) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", rank, " of job \"", job.name, "\" is held by ", Describe(*slot)));
    }
    if (!MemberOf(*slot, job.generation)) {
      return absl::AbortedError(absl::StrCat(Describe(*slot), " of job \"", job.name, "\" joined generation ",
                                             slot->generation(), ", not ", job.generation, ": join again"));
    }
    slot->set_last_heartbeat_micros(absl::ToUnixMicros(clock_->Now()));
    return absl::OkStatus();
  }
  auto it = job.by_identity.find(Identity(request.host(), request.device()));
  if (it != job.by_identity.end() && it->second != rank && job.slots[it->second]->state() == v1::WORKER_STATE_JOINED) {
    return absl::FailedPreconditionError(absl::StrCat(request.host(), "/", request.device(), " already joined job \"",
                                                      job.name, "\" as rank ", it->second, ", not ", rank));
  }
  Assign(job, rank, request, kAdoptedReason, effects);
  return absl::OkStatus();
}

// At the end of the adoption grace, a rank that has not re-registered did
// not survive the coordinator's restart: its group is broken.
bool JobRegistry::EndAdoption(Job& job, absl::Time now, Effects& effects) {
  if (!job.adopting_until.has_value() || now < *job.adopting_until) return false;
  job.adopting_until.reset();
  std::vector<int> missing;
  for (int r = 0; r < job.world_size; ++r) {
    if (!job.slots[r].has_value() || !MemberOf(*job.slots[r], job.generation)) {
      missing.push_back(r);
    }
  }
  if (missing.empty()) return false;
  BumpGeneration(job,
                 absl::StrCat(missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "),
                              " did not re-register within ", absl::FormatDuration(AdoptionGrace()),
                              " of the coordinator's restart"),
                 effects);
  return true;
}

absl::StatusOr<v1::WorkerStatus*> JobRegistry::FindWorker(Job& job, int rank, uint64_t incarnation) const {
  MUONSHARD_RETURN_IF_ERROR(CheckRank(job.name, rank, job.world_size));
  std::optional<v1::WorkerStatus>& slot = job.slots[rank];
  if (!slot.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of job \"", job.name, "\" has not joined"));
  }
  if (slot->incarnation() != incarnation) {
    return absl::AbortedError(absl::StrCat("rank ", rank, " of job \"", job.name, "\" is held by incarnation ",
                                           slot->incarnation(), ", not ", incarnation));
  }
  return &*slot;
}

absl::StatusOr<v1::HeartbeatResponse> JobRegistry::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, FindJob(request.job()));
  MUONSHARD_ASSIGN_OR_RETURN(v1::WorkerStatus * w, FindWorker(*job, request.rank(), request.incarnation()));
  if (w->state() != v1::WORKER_STATE_JOINED) {
    return absl::AbortedError(absl::StrCat(Describe(*w), " of job \"", job->name, "\" was marked ",
                                           w->state() == v1::WORKER_STATE_FAILED ? "failed" : "left", "; join again"));
  }
  // Alive, even when about to be told its generation is stale.
  w->set_last_heartbeat_micros(absl::ToUnixMicros(clock_->Now()));
  if (request.generation() != job->generation || w->generation() != job->generation) {
    if (job->failure.has_value()) return FailureStatus(*job->failure);
    // The reason (bounded: a reported message is cut to kMaxReportBytes)
    // tells the survivors why they restart.
    const std::string& why = job->generation_reason;
    return absl::AbortedError(absl::StrCat("generation ", request.generation(), " of job \"", job->name,
                                           "\" is stale; the job is at generation ", job->generation,
                                           why.empty() ? "" : absl::StrCat(" (", why, ")"), ": join again"));
  }
  v1::HeartbeatResponse r;
  r.set_generation(job->generation);
  r.set_plan_version(job->plan_version);
  return r;
}

absl::StatusOr<v1::LeaveJobResponse> JobRegistry::Leave(const v1::LeaveJobRequest& request) {
  Effects effects;
  v1::LeaveJobResponse r;
  {
    absl::MutexLock lock(&mu_);
    MUONSHARD_ASSIGN_OR_RETURN(Job * job, FindJob(request.job()));
    MUONSHARD_ASSIGN_OR_RETURN(v1::WorkerStatus * w, FindWorker(*job, request.rank(), request.incarnation()));
    if (w->state() != v1::WORKER_STATE_LEFT) {
      const bool was_member = MemberOf(*w, job->generation);
      SetState(*job, *w, v1::WORKER_STATE_LEFT);
      Emit(*job, v1::JOB_EVENT_WORKER_LEFT, w, "", effects);
      if (was_member) BumpGeneration(*job, absl::StrCat(Describe(*w), " left"), effects);
    }
    r.set_generation(job->generation);
  }
  Flush(effects);
  return r;
}

absl::StatusOr<v1::ReportErrorResponse> JobRegistry::ReportError(const v1::ReportErrorRequest& request) {
  const std::string message = BoundMessage(request.message());
  Effects effects;
  v1::ReportErrorResponse r;
  {
    absl::MutexLock lock(&mu_);
    MUONSHARD_ASSIGN_OR_RETURN(Job * job, FindJob(request.job()));
    MUONSHARD_ASSIGN_OR_RETURN(v1::WorkerStatus * w, FindWorker(*job, request.rank(), request.incarnation()));
    Emit(*job, v1::JOB_EVENT_ERROR_REPORTED, w, message, effects);
    if (request.ends_job() && !job->failure.has_value() && w->state() == v1::WORKER_STATE_JOINED) {
      Fail(*job, *w, request, message, effects);
    } else if (request.generation() == job->generation && MemberOf(*w, job->generation)) {
      // Only a member's report for the running generation breaks the group;
      // an older one arrives after the group has already moved on.
      BumpGeneration(*job, absl::StrCat(Describe(*w), " reported: ", message.empty() ? "(no message)" : message),
                     effects);
    }
    r.set_generation(job->generation);
    r.set_generation_reason(job->generation_reason);
    if (job->failure.has_value() && !IsFailureOf(*job->failure, *w)) *r.mutable_failure() = *job->failure;
  }
  Flush(effects);
  return r;
}

// NOTE [Job failure]: the job ends with `worker`'s error; its generation
// moves so that every wait, heartbeat and join of the old one returns it.
void JobRegistry::Fail(Job& job, const v1::WorkerStatus& worker, const v1::ReportErrorRequest& request,
                       const std::string& message, Effects& effects) {
  v1::JobFailure& f = job.failure.emplace();
  f.set_rank(worker.rank());
  f.set_host(worker.host());
  f.set_device(worker.device());
  f.set_generation(request.generation());
  f.set_code(FailureCode(request.code()));
  f.set_reason(absl::StrCat(Describe(worker), " failed: ", message.empty() ? "(no message)" : message));
  f.set_time_micros(absl::ToUnixMicros(clock_->Now()));
  BumpGeneration(job, f.reason(), effects);
}

bool JobRegistry::ExpireJobWorkers(Job& job, absl::Time now, Effects& effects) {
  std::vector<std::string> lost;
  for (std::optional<v1::WorkerStatus>& slot : job.slots) {
    if (!slot.has_value() || slot->state() != v1::WORKER_STATE_JOINED) continue;
    const absl::Duration silent = now - absl::FromUnixMicros(slot->last_heartbeat_micros());
    if (silent <= options_.heartbeat_timeout) continue;
    SetState(job, *slot, v1::WORKER_STATE_FAILED);
    Emit(job, v1::JOB_EVENT_WORKER_FAILED, &*slot, absl::StrCat("no heartbeat for ", absl::FormatDuration(silent)),
         effects);
    if (slot->generation() == job.generation) lost.push_back(Describe(*slot));
  }
  if (lost.empty()) return EndAdoption(job, now, effects);
  // One bump for everything found in this pass (it ends an adoption too): the
  // group re-forms once.
  BumpGeneration(job,
                 absl::StrCat(absl::StrJoin(lost, ", "), " missed heartbeats for ",
                              absl::FormatDuration(options_.heartbeat_timeout)),
                 effects);
  return true;
}

void JobRegistry::CheckHeartbeats() {
  Effects effects;
  std::vector<Resize> shrinks;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    for (auto& [name, job] : jobs_) {
      ExpireJobWorkers(*job, now, effects);
      if (std::optional<Resize> r = ShrinkCandidate(*job, now)) shrinks.push_back(*std::move(r));
    }
  }
  Flush(effects);
  for (const Resize& r : shrinks) Shrink(r);
}

// ---------------------------------------------------------------- elastic

std::optional<JobRegistry::Resize> JobRegistry::ShrinkCandidate(const Job& job, absl::Time now) const {
  if (job.min_workers <= 0 || job.adopting_until.has_value() || job.resize_failed_at == job.generation ||
      job.failure.has_value() || now - job.moved_at < job.rejoin_grace) {
    return std::nullopt;
  }
  Resize r;
  int gone = 0;
  for (int first = 0; first < job.world_size; first += job.block) {
    int present = 0;
    for (int rank = first; rank < first + job.block; ++rank) {
      present += job.slots[rank].has_value() && MemberOf(*job.slots[rank], job.generation);
    }
    gone += job.block - present;
    if (present < job.block) continue;  // the whole block leaves
    for (int rank = first; rank < first + job.block; ++rank) r.keep.push_back(rank);
  }
  const int n = static_cast<int>(r.keep.size());
  if (n == job.world_size || n < job.min_workers || n == 0) return std::nullopt;
  r.job = job.name;
  r.generation = job.generation;
  r.from_version = job.plan_version;
  r.world_size = n;
  r.reason =
      absl::StrCat("shrunk from ", job.world_size, " to ", n, " ranks: ", gone, " rank(s) did not re-join generation ",
                   job.generation, " within ", absl::FormatDuration(job.rejoin_grace));
  if (job.world_size - n > gone) {
    absl::StrAppend(&r.reason, " (whole blocks of ", job.block,
                    " ranks, pp x max(ep, tp), leave: ", job.world_size - n - gone, " present rank(s) with them)");
  }
  return r;
}

absl::StatusOr<std::optional<JobRegistry::Resize>> JobRegistry::GrowCandidate(Job& job,
                                                                              const v1::JoinJobRequest& request) {
  if (job.min_workers <= 0 || job.world_size >= job.max_world_size) return std::nullopt;
  std::string joined = absl::StrCat(request.host(), "/", request.device());
  if (job.block > 1) {
    // A block grows back whole: newcomers wait, retrying, until a block of
    // them is here (one that stopped retrying is forgotten).
    const absl::Time now = clock_->Now();
    absl::erase_if(job.waiting, [&](const auto& w) { return now - w.second > 3 * options_.heartbeat_timeout; });
    job.waiting[Identity(request.host(), request.device())] = now;
    if (static_cast<int>(job.waiting.size()) < job.block) {
      return absl::UnavailableError(absl::StrCat("job \"", job.name, "\" is full at ", job.world_size, " of ",
                                                 job.max_world_size, " ranks and grows back by whole blocks of ",
                                                 job.block, " ranks (pp x max(ep, tp)): ", job.waiting.size(), " of ",
                                                 job.block, " newcomers are waiting"));
    }
    joined = absl::StrCat(job.waiting.size(), " newcomers joined");
    job.waiting.clear();
  }
  Resize r;
  r.job = job.name;
  r.generation = job.generation;
  r.from_version = job.plan_version;
  for (int rank = 0; rank < job.world_size; ++rank) r.keep.push_back(rank);
  r.world_size = job.world_size + job.block;
  r.reason = absl::StrCat("grew from ", job.world_size, " to ", r.world_size, " ranks: ", joined);
  return r;
}

absl::StatusOr<v1::PlanVersionInfo> JobRegistry::PlanResize(const Resize& resize) {
  std::vector<int> new_rank_of(resize.keep.empty() ? 0 : *std::max_element(resize.keep.begin(), resize.keep.end()) + 1,
                               -1);
  for (size_t i = 0; i < resize.keep.size(); ++i) new_rank_of[resize.keep[i]] = static_cast<int>(i);
  MUONSHARD_ASSIGN_OR_RETURN(v1::SubmitPlanResponse planned,
                             catalog_->Resize(resize.from_version, new_rank_of, resize.world_size));
  return planned.info();
}

void JobRegistry::Shrink(const Resize& resize) {
  absl::StatusOr<v1::PlanVersionInfo> info = PlanResize(resize);
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(resize.job);
    if (it == jobs_.end() || it->second->generation != resize.generation) return;  // moved on meanwhile
    Job& job = *it->second;
    if (!info.ok()) {
      // Not retried in this generation: the plan would fail again.
      job.resize_failed_at = job.generation;
      job.resize_error = absl::StrCat(resize.reason, ": ", info.status().ToString());
      return;
    }
    ApplyResize(job, resize, *info, effects);
  }
  Flush(effects);
}

absl::StatusOr<v1::JoinJobResponse> JobRegistry::Grow(const Resize& resize, const v1::JoinJobRequest& request,
                                                      Effects& effects) {
  absl::StatusOr<v1::PlanVersionInfo> info = PlanResize(resize);
  if (!info.ok()) {
    return Annotate(info.status(), absl::StrCat("job \"", resize.job, "\" is full; ", resize.reason));
  }
  absl::MutexLock lock(&mu_);
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, FindJob(resize.job));
  if (job->generation != resize.generation || job->world_size != static_cast<int>(resize.keep.size())) {
    return absl::UnavailableError(
        absl::StrCat("job \"", resize.job, "\" changed while it was being grown for this worker; join again"));
  }
  ApplyResize(*job, resize, *info, effects);
  const int rank = static_cast<int>(resize.keep.size());  // the first new rank; the others take the rest
  Assign(*job, rank, request, "grew the job", effects);
  return JoinResponse(*job, rank);
}

void JobRegistry::ApplyResize(Job& job, const Resize& resize, const v1::PlanVersionInfo& info, Effects& effects) {
  std::vector<std::optional<v1::WorkerStatus>> slots(resize.world_size);
  job.by_identity.clear();
  for (size_t i = 0; i < resize.keep.size(); ++i) {
    slots[i] = std::move(job.slots[resize.keep[i]]);
    slots[i]->set_rank(static_cast<int>(i));
    job.by_identity[Identity(slots[i]->host(), slots[i]->device())] = static_cast<int>(i);
  }
  job.slots = std::move(slots);
  job.plan_version = info.version();
  job.content_hash = info.content_hash();
  job.world_size = resize.world_size;
  job.resize_error.clear();
  Recount(job);
  BumpGeneration(job, absl::StrCat(resize.reason, "; plan version ", info.version()), effects);
}

void JobRegistry::Recount(Job& job) {
  job.counts = WorkerCounts();
  job.free.clear();
  for (int r = 0; r < job.world_size; ++r) {
    const std::optional<v1::WorkerStatus>& slot = job.slots[r];
    const v1::WorkerState state = slot.has_value() ? slot->state() : v1::WORKER_STATE_UNSPECIFIED;
    if (state == v1::WORKER_STATE_JOINED) ++job.counts.joined;
    if (state == v1::WORKER_STATE_FAILED) ++job.counts.failed;
    if (state == v1::WORKER_STATE_LEFT) ++job.counts.left;
    if (state != v1::WORKER_STATE_JOINED) job.free.insert(r);
  }
}

v1::JobStatus JobRegistry::StatusOf(const Job& job) const {
  v1::JobStatus s;
  s.set_job(job.name);
  s.set_generation(job.generation);
  s.set_plan_version(job.plan_version);
  s.set_world_size(job.world_size);
  s.set_revision(job.revision);
  s.set_min_workers(job.min_workers);
  s.set_max_world_size(job.max_world_size);
  s.set_resize_error(job.resize_error);
  s.set_generation_reason(job.generation_reason);
  if (job.failure.has_value()) *s.mutable_failure() = *job.failure;
  for (const std::optional<v1::WorkerStatus>& slot : job.slots) {
    if (slot.has_value()) *s.add_workers() = *slot;
  }
  return s;
}

absl::StatusOr<v1::ListWorkersResponse> JobRegistry::ListWorkers(const std::string& job) const {
  v1::ListWorkersResponse r;
  absl::MutexLock lock(&mu_);
  if (!job.empty()) {
    MUONSHARD_ASSIGN_OR_RETURN(Job * j, FindJob(job));
    *r.add_jobs() = StatusOf(*j);
    return r;
  }
  std::vector<const Job*> all;
  for (const auto& [name, j] : jobs_) all.push_back(j.get());
  std::sort(all.begin(), all.end(), [](const Job* a, const Job* b) { return a->name < b->name; });
  for (const Job* j : all) *r.add_jobs() = StatusOf(*j);
  return r;
}

// ---------------------------------------------------------------- rendezvous

absl::Status JobRegistry::CheckGeneration(const Job& job, int64_t generation) const {
  if (generation == job.generation) return absl::OkStatus();
  if (job.failure.has_value()) return FailureStatus(*job.failure);
  const std::string& why = job.generation_reason;
  return absl::AbortedError(absl::StrCat("generation ", generation, " is not job \"", job.name,
                                         "\"'s current generation ", job.generation,
                                         why.empty() ? "" : absl::StrCat(" (", why, ")")));
}

absl::Status JobRegistry::SetKey(const v1::SetKeyRequest& request) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    MUONSHARD_ASSIGN_OR_RETURN(Job * job, FindJob(request.job()));
    MUONSHARD_RETURN_IF_ERROR(CheckGeneration(*job, request.generation()));
    MUONSHARD_RETURN_IF_ERROR(
        job->kv->Set(request.key(), request.value(), request.create_only(), &effects.completions));
  }
  Flush(effects);
  return absl::OkStatus();
}

absl::StatusOr<v1::GetKeyResponse> JobRegistry::GetKey(const v1::GetKeyRequest& request) const {
  absl::MutexLock lock(&mu_);
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, FindJob(request.job()));
  MUONSHARD_RETURN_IF_ERROR(CheckGeneration(*job, request.generation()));
  v1::GetKeyResponse r;
  MUONSHARD_ASSIGN_OR_RETURN(*r.mutable_value(), job->kv->Get(request.key()));
  return r;
}

absl::StatusOr<JobRegistry::WaitStarted> JobRegistry::WaitKeys(const v1::WaitKeysRequest& request,
                                                               WaitCallback callback) {
  if (request.keys().empty()) return absl::InvalidArgumentError("no keys to wait for");
  if (request.keys_size() > options_.max_keys_per_wait) {
    return absl::InvalidArgumentError(
        absl::StrCat("waiting for ", request.keys_size(), " keys; the limit is ", options_.max_keys_per_wait));
  }
  for (const std::string& key : request.keys()) MUONSHARD_RETURN_IF_ERROR(CheckKey(key, options_));
  if (request.timeout_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms ", request.timeout_ms(), " is negative"));
  }
  const absl::Duration timeout = std::min(
      request.timeout_ms() == 0 ? options_.default_wait : absl::Milliseconds(request.timeout_ms()), options_.max_wait);
  std::vector<std::string> keys(request.keys().begin(), request.keys().end());

  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("coordinator is shutting down");
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, FindJob(request.job()));
  MUONSHARD_RETURN_IF_ERROR(CheckGeneration(*job, request.generation()));
  WaitStarted started;
  if ((started.values = job->kv->GetAll(keys))) return started;
  size_t waiters = 0;
  for (const auto& [name, j] : jobs_) waiters += j->kv->num_waiters();
  if (static_cast<int64_t>(waiters) >= options_.max_waiters) {
    return absl::ResourceExhaustedError(absl::StrCat(waiters, " rendezvous waits are pending; the limit is ",
                                                     options_.max_waiters, " (--max-waiters)"));
  }
  started.id = next_wait_id_++;
  job->kv->AddWaiter(started.id, std::move(keys), clock_->Now() + timeout, std::move(callback));
  return started;
}

bool JobRegistry::CancelWait(uint64_t id) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, job] : jobs_) {
    if (job->kv->Cancel(id)) return true;
  }
  return false;
}

void JobRegistry::ExpireWaits() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    for (auto& [name, job] : jobs_) job->kv->ExpireBefore(now, &effects.completions);
  }
  Flush(effects);
}

void JobRegistry::Shutdown() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [name, job] : jobs_) {
      job->kv->AbortAll(absl::UnavailableError("coordinator is shutting down"), &effects.completions);
    }
  }
  Flush(effects);
}

// ---------------------------------------------------------------- watch

v1::JobEvent JobRegistry::Snapshot(const std::string& name, const Job* job) const {
  v1::JobEvent e;
  e.set_job(name);
  e.set_type(v1::JOB_EVENT_SNAPSHOT);
  e.set_time_micros(absl::ToUnixMicros(clock_->Now()));
  if (job == nullptr) return e;  // revision 0: the job does not exist yet
  v1::JobStatus s = StatusOf(*job);
  e.set_revision(job->revision);
  e.set_generation(job->generation);
  e.set_plan_version(job->plan_version);
  e.set_world_size(job->world_size);
  e.mutable_workers()->Swap(s.mutable_workers());
  return e;
}

std::optional<v1::JobEvent> JobRegistry::NextEvent(const std::string& job, std::optional<int64_t> cursor) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  const Job* j = it == jobs_.end() ? nullptr : it->second.get();
  if (j == nullptr) {
    if (cursor == 0) return std::nullopt;  // has seen the empty snapshot
    return Snapshot(job, nullptr);
  }
  if (!cursor.has_value()) return Snapshot(job, j);
  if (*cursor == j->revision) return std::nullopt;
  const int64_t first = j->history.empty() ? j->revision + 1 : j->history.front().revision();
  int64_t c = *cursor;
  // Saw the job before it existed: replay it from its start if still held.
  if (c == 0 && first == j->base_revision + 1) c = j->base_revision;
  if (c >= first - 1 && c < j->revision) return j->history[static_cast<size_t>(c + 1 - first)];
  return Snapshot(job, j);
}

}  // namespace muonshard::coordinator
