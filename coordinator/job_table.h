#ifndef MUONSHARD_COORDINATOR_JOB_TABLE_H_
#define MUONSHARD_COORDINATOR_JOB_TABLE_H_

// JobTable: the jobs this coordinator process knows, by name, each a Job
// record whose fields are grouped by the part of JobRegistry that owns them
// (see job_registry.h). Jobs are never removed.
//
// Not thread-safe: JobRegistry holds the table, and every part that reaches
// it, under its one mutex.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/job_roster.h"
#include "coordinator/options.h"
#include "coordinator/rendezvous_kv.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

// Job revisions of one coordinator process start at generation x kRevisionBase
// (NOTE [Membership state machine]).
inline constexpr int64_t kRevisionBase = 1'000'000'000;

// NOTE [Elastic jobs] (coordinator.proto): ElasticResizer's part of a job,
// set by the join that (re)starts it.
struct ElasticState {
  int min_workers = 0;  // 0 = not elastic
  absl::Duration rejoin_grace;
  int max_world_size = 0;           // the world of the plan the job started with
  int64_t origin_plan_version = 0;  // that plan's version
  // Newcomers to a full job with block > 1, waiting to grow it by a block:
  // when each last asked.
  absl::flat_hash_map<Identity, absl::Time> waiting;
  std::string resize_error;
  int64_t resize_failed_at = 0;  // the generation a resize could not be planned for
};

// JobEvents' part: the job's watch history and what the observer was told.
struct EventHistory {
  int64_t base_revision = 0;
  int64_t revision = 0;
  std::deque<v1::JobEvent> events;
  int64_t announced_plan = 0;  // the version the observer was told it runs (0: none)
};

struct Job {
  explicit Job(const std::string& job_name) : name(job_name), roster(job_name) {}

  const std::string name;
  JobRoster roster;  // JobMembership: ranks, workers, plan version

  // GenerationTracker: the generation fence, the keys of the generation and
  // the job's failure.
  int64_t generation = 0;
  std::string generation_reason;  // why the job moved to `generation`
  absl::Time moved_at;            // when `generation` began
  std::unique_ptr<RendezvousKv> kv;
  // NOTE [Job failure]: set by the first report that ends the job; cleared
  // when the job starts afresh (a join with no worker joined).
  std::optional<v1::JobFailure> failure;

  // JobAdoption (NOTE [Adoption]): set while the job re-created from a
  // restart waits for its running ranks to re-register; the generation
  // moves if one has not.
  std::optional<absl::Time> adopting_until;

  ElasticState elastic;
  EventHistory history;
};

// Side effects collected under the registry's lock and run (JobRegistry::
// Flush) after it is released.
struct Effects {
  std::vector<WaitCompletion> completions;
  std::vector<std::string> changed_jobs;  // jobs with new events
};

class JobTable {
 public:
  using Map = absl::flat_hash_map<std::string, std::unique_ptr<Job>>;

  // *options must outlive the table (each job's keys point to it).
  explicit JobTable(const CoordinatorOptions* options) : options_(options) {}

  // NOT_FOUND for an unknown job.
  absl::StatusOr<Job*> Find(const std::string& name) const;
  // Null for an unknown job.
  Job* FindOrNull(const std::string& name) const;

  // RESOURCE_EXHAUSTED when --max-jobs jobs are known.
  absl::Status CheckRoom() const;

  // Adds `name` (not known yet) at `generation`, moved there for `reason`,
  // its revisions starting after `base_revision`.
  Job* Add(const std::string& name, int64_t generation, int64_t base_revision, std::string reason);

  // Every job, in no order.
  const Map& jobs() const { return jobs_; }
  // Every job, by name.
  std::vector<const Job*> Sorted() const;

 private:
  const CoordinatorOptions* const options_;
  Map jobs_;
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_JOB_TABLE_H_
