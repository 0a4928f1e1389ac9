#include "coordinator/elastic_resizer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muonshard::coordinator {

void ElasticResizer::Start(Job& job, const v1::JoinJobRequest& request, const v1::PlanVersionInfo& info) const {
  ElasticState& e = job.elastic;
  e.min_workers = request.min_workers();
  e.rejoin_grace =
      request.rejoin_grace_ms() > 0 ? absl::Milliseconds(request.rejoin_grace_ms()) : 10 * options_->heartbeat_timeout;
  e.max_world_size = info.topology().world_size();
  e.origin_plan_version = info.version();
}

bool ElasticResizer::AdmitsOrigin(const Job& job, int64_t version) {
  return job.elastic.min_workers > 0 && version == job.elastic.origin_plan_version;
}

std::optional<ElasticResizer::Resize> ElasticResizer::ShrinkCandidate(const Job& job, absl::Time now) const {
  const ElasticState& e = job.elastic;
  if (e.min_workers <= 0 || job.adopting_until.has_value() || e.resize_failed_at == job.generation ||
      job.failure.has_value() || now - job.moved_at < e.rejoin_grace) {
    return std::nullopt;
  }
  const int world = job.roster.world_size();
  const int block = job.roster.block();
  Resize r;
  int gone = 0;
  for (int first = 0; first < world; first += block) {
    int present = 0;
    for (int rank = first; rank < first + block; ++rank) present += job.roster.IsMember(rank, job.generation);
    gone += block - present;
    if (present < block) continue;  // the whole block leaves
    for (int rank = first; rank < first + block; ++rank) r.keep.push_back(rank);
  }
  const int n = static_cast<int>(r.keep.size());
  if (n == world || n < e.min_workers || n == 0) return std::nullopt;
  r.job = job.name;
  r.generation = job.generation;
  r.from_version = job.roster.plan_version();
  r.world_size = n;
  r.reason = absl::StrCat("shrunk from ", world, " to ", n, " ranks: ", gone, " rank(s) did not re-join generation ",
                          job.generation, " within ", absl::FormatDuration(e.rejoin_grace));
  if (world - n > gone) {
    absl::StrAppend(&r.reason, " (whole blocks of ", block, " ranks, pp x max(ep, tp), leave: ", world - n - gone,
                    " present rank(s) with them)");
  }
  return r;
}

absl::StatusOr<std::optional<ElasticResizer::Resize>> ElasticResizer::GrowCandidate(Job& job,
                                                                                    const v1::JoinJobRequest& request) {
  ElasticState& e = job.elastic;
  const int world = job.roster.world_size();
  const int block = job.roster.block();
  if (e.min_workers <= 0 || world >= e.max_world_size) return std::nullopt;
  std::string joined = absl::StrCat(request.host(), "/", request.device());
  if (block > 1) {
    // A block grows back whole: newcomers wait, retrying, until a block of
    // them is here (one that stopped retrying is forgotten).
    const absl::Time now = clock_->Now();
    absl::erase_if(e.waiting, [&](const auto& w) { return now - w.second > 3 * options_->heartbeat_timeout; });
    e.waiting[Identity(request.host(), request.device())] = now;
    if (static_cast<int>(e.waiting.size()) < block) {
      return absl::UnavailableError(absl::StrCat("job \"", job.name, "\" is full at ", world, " of ", e.max_world_size,
                                                 " ranks and grows back by whole blocks of ", block,
                                                 " ranks (pp x max(ep, tp)): ", e.waiting.size(), " of ", block,
                                                 " newcomers are waiting"));
    }
    joined = absl::StrCat(e.waiting.size(), " newcomers joined");
    e.waiting.clear();
  }
  Resize r;
  r.job = job.name;
  r.generation = job.generation;
  r.from_version = job.roster.plan_version();
  for (int rank = 0; rank < world; ++rank) r.keep.push_back(rank);
  r.world_size = world + block;
  r.reason = absl::StrCat("grew from ", world, " to ", r.world_size, " ranks: ", joined);
  return r;
}

void ElasticResizer::FinishShrink(const Resize& resize, const absl::StatusOr<v1::PlanVersionInfo>& info,
                                  Effects& effects) {
  Job* job = table_->FindOrNull(resize.job);
  if (job == nullptr || job->generation != resize.generation) return;  // moved on meanwhile
  if (!info.ok()) {
    // Not retried in this generation: the plan would fail again.
    job->elastic.resize_failed_at = job->generation;
    job->elastic.resize_error = absl::StrCat(resize.reason, ": ", info.status().ToString());
    return;
  }
  Apply(*job, resize, *info, effects);
}

absl::StatusOr<Job*> ElasticResizer::FinishGrow(const Resize& resize, const v1::PlanVersionInfo& info,
                                                Effects& effects) {
  MUONSHARD_ASSIGN_OR_RETURN(Job * job, table_->Find(resize.job));
  if (job->generation != resize.generation || job->roster.world_size() != static_cast<int>(resize.keep.size())) {
    return absl::UnavailableError(
        absl::StrCat("job \"", resize.job, "\" changed while it was being grown for this worker; join again"));
  }
  Apply(*job, resize, info, effects);
  return job;
}

void ElasticResizer::Apply(Job& job, const Resize& resize, const v1::PlanVersionInfo& info, Effects& effects) {
  job.roster.Renumber(resize.keep, resize.world_size, info);
  job.elastic.resize_error.clear();
  generations_->Bump(job, absl::StrCat(resize.reason, "; plan version ", info.version()), effects);
}

absl::StatusOr<v1::PlanVersionInfo> PlanResize(PlanCatalog& catalog, const ElasticResizer::Resize& resize) {
  std::vector<int> new_rank_of(resize.keep.empty() ? 0 : *std::max_element(resize.keep.begin(), resize.keep.end()) + 1,
                               -1);
  for (size_t i = 0; i < resize.keep.size(); ++i) new_rank_of[resize.keep[i]] = static_cast<int>(i);
  MUONSHARD_ASSIGN_OR_RETURN(v1::SubmitPlanResponse planned,
                             catalog.Resize(resize.from_version, new_rank_of, resize.world_size));
  return planned.info();
}

}  // namespace muonshard::coordinator
