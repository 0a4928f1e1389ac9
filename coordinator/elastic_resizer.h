#ifndef MUONSHARD_COORDINATOR_ELASTIC_RESIZER_H_
#define MUONSHARD_COORDINATOR_ELASTIC_RESIZER_H_

// ElasticResizer: the world-size changes of elastic jobs (NOTE [Elastic
// jobs] in coordinator.proto and job_registry.h). Finds the shrink a job
// whose ranks stayed away is due (ShrinkCandidate) and the grow a newcomer
// to a full job asks for (GrowCandidate); PlanResize plans either through
// the catalog outside the registry's lock; Finish* apply the plan if the job
// is still at the generation it was planned for: the kept members are
// renumbered in their old order, the job takes the new plan and world, and
// its generation moves.
//
// Not thread-safe: part of JobRegistry, which calls it only under its mutex
// (PlanResize excepted: it touches no job).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/generation_tracker.h"
#include "coordinator/job_table.h"
#include "coordinator/options.h"
#include "coordinator/plan_catalog.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

class ElasticResizer {
 public:
  // A planned change of an elastic job's world.
  struct Resize {
    std::string job;
    int64_t generation = 0;  // applied only while the job is still at it
    int64_t from_version = 0;
    std::vector<int> keep;  // old ranks kept; new rank = index
    int world_size = 0;     // keep.size(), plus a grow's newcomers (a block)
    std::string reason;
  };

  // Every pointer must outlive this object.
  ElasticResizer(JobTable* table, GenerationTracker* generations, Clock* clock, const CoordinatorOptions* options)
      : table_(table), generations_(generations), clock_(clock), options_(options) {}

  // A (re)started job takes its elastic settings from the join that started
  // it on `info`'s plan (min_workers 0: not elastic).
  void Start(Job& job, const v1::JoinJobRequest& request, const v1::PlanVersionInfo& info) const;

  // Whether a joiner of the running `job` may ask for `version` besides the
  // job's: an elastic job admits the version it started with (a process
  // restarted with its first command line after a resize).
  static bool AdmitsOrigin(const Job& job, int64_t version);

  // The shrink due at `now`: the members present in the job's generation
  // (by whole blocks) are fewer than its world, at least min_workers, and
  // the generation moved rejoin_grace ago. None otherwise.
  std::optional<Resize> ShrinkCandidate(const Job& job, absl::Time now) const;

  // The grow a newcomer to the full `job` asks for (none when the job is not
  // elastic or back at its world). With blocks of more than one rank,
  // UNAVAILABLE (the client retries) until a block of newcomers is waiting.
  absl::StatusOr<std::optional<Resize>> GrowCandidate(Job& job, const v1::JoinJobRequest& request);

  // Applies a planned shrink if the job has not moved meanwhile; a plan that
  // failed is kept as the job's resize_error and not retried in its
  // generation.
  void FinishShrink(const Resize& resize, const absl::StatusOr<v1::PlanVersionInfo>& info, Effects& effects);

  // Applies a planned grow; the job, whose newcomer then takes rank
  // resize.keep.size(). Possible errors: NOT_FOUND (job), UNAVAILABLE (the
  // job changed meanwhile).
  absl::StatusOr<Job*> FinishGrow(const Resize& resize, const v1::PlanVersionInfo& info, Effects& effects);

 private:
  void Apply(Job& job, const Resize& resize, const v1::PlanVersionInfo& info, Effects& effects);

  JobTable* const table_;
  GenerationTracker* const generations_;
  Clock* const clock_;
  const CoordinatorOptions* const options_;
};

// Plans `resize` through the catalog (a new or existing plan version). Call
// without the registry's lock: planning takes long.
absl::StatusOr<v1::PlanVersionInfo> PlanResize(PlanCatalog& catalog, const ElasticResizer::Resize& resize);

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_ELASTIC_RESIZER_H_
