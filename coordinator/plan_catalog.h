#ifndef MUONSHARD_COORDINATOR_PLAN_CATALOG_H_
#define MUONSHARD_COORDINATOR_PLAN_CATALOG_H_

// PlanCatalog: the plan half of the coordinator domain. Computes plans with
// the pure planner, stores them in a PlanStore, keeps every version's
// metadata in memory (the index watchers replay from), and serves whole plans
// and per-rank views from two caches: decoded plans with their RankViews
// (NOTE [Shared view pieces]), and encoded whole-plan responses.
//
// Thread-safe. Plans are computed outside every lock; storing and indexing a
// new version is serialized so the index only ever grows at its end (a
// watcher at version v never misses v+1 because v+2 was indexed first).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/lru_cache.h"
#include "coordinator/observer.h"
#include "coordinator/options.h"
#include "coordinator/plan_store.h"
#include "coordinator/rank_views.h"
#include "muonshard/v1/coordinator.pb.h"

namespace muonshard::coordinator {

class PlanCatalog {
 public:
  // *store, *clock and *observer must outlive the catalog.
  PlanCatalog(PlanStore* store, Clock* clock, const CoordinatorOptions& options, CoordinatorObserver* observer);

  // Reads the index from the store and announces the latest plan to the
  // observer. Call once, before anything else.
  absl::Status Load();

  // Possible errors: INVALID_ARGUMENT (the planner's, naming the tensor or
  // field), RESOURCE_EXHAUSTED (tensor / world-size limits), store errors.
  absl::StatusOr<v1::SubmitPlanResponse> Submit(const v1::PlanRequest& request);

  // NOTE [Elastic jobs] (coordinator.proto): a plan of `from_version`'s
  // request for `world_size` ranks, balanced and sticky to `from_version`'s
  // plan, whose rank r is rank new_rank_of[r] in the new plan (-1: gone), so
  // Muon owners stay put where balance allows. Stored like a submitted plan
  // (an identical plan is the existing version). Possible errors: Submit's
  // and GetPlan's (INVALID_ARGUMENT when the topology cannot take
  // `world_size`, e.g. expert parallelism that does not divide it).
  absl::StatusOr<v1::SubmitPlanResponse> Resize(int64_t from_version, const std::vector<int>& new_rank_of,
                                                int world_size);

  // NOTE [Serialized responses]: a GetPlanResponse is returned encoded, in
  // cached pieces, so the gRPC adapter sends them without encoding a
  // RankView per call (views of 1k-rank plans are tens of KiB).
  // version 0 = latest. Possible errors: FAILED_PRECONDITION (nothing
  // submitted yet), NOT_FOUND (unknown version), INVALID_ARGUMENT (rank
  // outside the plan's world), DATA_LOSS / UNAVAILABLE (store).
  // `with_request` appends the canonical request (GetPlanResponse.request) to
  // a whole-plan response.
  absl::StatusOr<SerializedPieces> GetResponse(int64_t version, std::optional<int> rank, bool with_request = false);

  // The decoded plan of a version (0 = latest); errors as GetResponseBytes.
  absl::StatusOr<std::shared_ptr<const v1::Plan>> GetPlan(int64_t version);

  // Metadata of a version (0 = latest); FAILED_PRECONDITION / NOT_FOUND.
  absl::StatusOr<v1::PlanVersionInfo> Info(int64_t version) const;

  // 0 when nothing is stored.
  int64_t latest_version() const;

  // Up to `limit` versions > `after`, oldest first.
  std::vector<v1::PlanVersionInfo> After(int64_t after, int limit) const;

  // Possible errors: as GetPlan for either version.
  absl::StatusOr<v1::PlanDiff> Diff(int64_t from_version, int64_t to_version, int limit);

 private:
  absl::Status CheckLimits(const v1::PlanRequest& request) const;
  absl::StatusOr<int64_t> Resolve(int64_t version) const;
  // The cached plan of a resolved version, read from the store on a miss.
  absl::StatusOr<std::shared_ptr<const RankViews>> Load(int64_t version);
  void Cache(int64_t version, std::shared_ptr<const v1::Plan> plan);
  absl::StatusOr<v1::SubmitPlanResponse> Store(const v1::PlanRequest& canonical, const std::string& hash,
                                               std::shared_ptr<const v1::Plan> plan, absl::Duration compute);
  std::optional<v1::SubmitPlanResponse> Existing(const std::string& hash) const;

  PlanStore* const store_;
  Clock* const clock_;
  const CoordinatorOptions options_;
  CoordinatorObserver* const observer_;

  mutable absl::Mutex mu_;
  std::map<int64_t, v1::PlanVersionInfo> index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> by_hash_ ABSL_GUARDED_BY(mu_);

  // Serializes Store() so versions are indexed in order.
  absl::Mutex submit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Held while a plan is read from the store, so concurrent misses on one
  // (possibly huge) plan decode it once.
  absl::Mutex load_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  LruCache<int64_t, RankViews> plans_;          // decoded plans and their views
  LruCache<int64_t, std::string> whole_plans_;  // encoded GetPlanResponse{info, plan}
};

}  // namespace muonshard::coordinator

#endif  // MUONSHARD_COORDINATOR_PLAN_CATALOG_H_
