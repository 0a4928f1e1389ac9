#include "coordinator/plan_catalog.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/plan_diff.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "plan/plan_view.h"
#include "plan/planner.h"

namespace muonshard::coordinator {
namespace {

using google::protobuf::internal::WireFormatLite;

// Decoded protobuf messages take roughly twice their wire size in memory;
// the views' shared bodies about as much again.
int64_t MemoryEstimate(const v1::Plan& plan) { return 3 * static_cast<int64_t>(plan.ByteSizeLong()); }

// Appends `message` as length-delimited field `field` of the enclosing message.
void WriteField(int field, const google::protobuf::MessageLite& message, google::protobuf::io::CodedOutputStream* out) {
  const size_t size = message.ByteSizeLong();  // also caches the sizes
  WireFormatLite::WriteTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, out);
  out->WriteVarint32(static_cast<uint32_t>(size));
  message.SerializeWithCachedSizes(out);
}

// GetPlanResponse{info, plan} encoded field by field, so a whole (possibly
// huge) plan is serialized once instead of being copied into a response
// message first.
std::string SerializeWholePlanResponse(const v1::PlanVersionInfo& info, const v1::Plan& plan) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    WriteField(v1::GetPlanResponse::kInfoFieldNumber, info, &coded);
    WriteField(v1::GetPlanResponse::kPlanFieldNumber, plan, &coded);
  }
  return out;
}

v1::PlanVersionInfo MakeInfo(const std::string& hash, absl::Time now, const v1::Plan& plan) {
  v1::PlanVersionInfo info;
  info.set_content_hash(hash);
  info.set_create_time_micros(absl::ToUnixMicros(now));
  info.set_model(plan.model());
  *info.mutable_topology() = plan.topology();
  info.set_policy(plan.policy().policy());
  info.set_tensors(plan.tensors_size());
  *info.mutable_stats() = plan.stats();
  info.set_plan_bytes(static_cast<int64_t>(plan.ByteSizeLong()));
  return info;
}

v1::SubmitPlanResponse MakeSubmitResponse(const v1::PlanVersionInfo& info, bool created) {
  v1::SubmitPlanResponse r;
  r.set_version(info.version());
  r.set_content_hash(info.content_hash());
  r.set_created(created);
  *r.mutable_info() = info;
  return r;
}

}  // namespace

PlanCatalog::PlanCatalog(PlanStore* store, Clock* clock, const CoordinatorOptions& options,
                         CoordinatorObserver* observer)
    : store_(store),
      clock_(clock),
      options_(options),
      observer_(observer),
      plans_(options.cache_bytes / 2),
      whole_plans_(options.cache_bytes / 2) {}

absl::Status PlanCatalog::Load() {
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<v1::PlanVersionInfo> versions, store_->ListVersions());
  {
    absl::MutexLock lock(&mu_);
    for (v1::PlanVersionInfo& info : versions) {
      by_hash_[info.content_hash()] = info.version();
      index_[info.version()] = std::move(info);
    }
  }
  if (latest_version() == 0) return absl::OkStatus();
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<const v1::Plan> plan, GetPlan(0));
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanVersionInfo info, Info(0));
  observer_->OnLatestPlan(info, *plan);
  return absl::OkStatus();
}

absl::Status PlanCatalog::CheckLimits(const v1::PlanRequest& request) const {
  if (request.manifest().tensors_size() > options_.max_tensors) {
    return absl::ResourceExhaustedError(absl::StrCat("manifest has ", request.manifest().tensors_size(),
                                                     " tensors; this coordinator accepts "
                                                     "at most ",
                                                     options_.max_tensors, " (--max-tensors)"));
  }
  if (request.topology().world_size() > options_.max_world_size) {
    return absl::ResourceExhaustedError(absl::StrCat("topology.world_size ", request.topology().world_size(),
                                                     " exceeds this coordinator's "
                                                     "limit of ",
                                                     options_.max_world_size, " (--max-world-size)"));
  }
  return absl::OkStatus();
}

std::optional<v1::SubmitPlanResponse> PlanCatalog::Existing(const std::string& hash) const {
  absl::MutexLock lock(&mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  return MakeSubmitResponse(index_.at(it->second), /*created=*/false);
}

absl::StatusOr<v1::SubmitPlanResponse> PlanCatalog::Submit(const v1::PlanRequest& request) {
  MUONSHARD_RETURN_IF_ERROR(CheckLimits(request));
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanRequest canonical, planner::CanonicalizeRequest(request));
  const std::string hash = planner::ContentHash(canonical);
  if (std::optional<v1::SubmitPlanResponse> existing = Existing(hash)) return *existing;
  const absl::Time start = clock_->Now();
  // On an arena: a 70k-tensor plan builds in about half the time (bench/planner).
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<const v1::Plan> plan, planner::ComputeSharedPlan(canonical));
  return Store(canonical, hash, std::move(plan), clock_->Now() - start);
}

absl::StatusOr<v1::SubmitPlanResponse> PlanCatalog::Resize(int64_t from_version, const std::vector<int>& new_rank_of,
                                                           int world_size) {
  MUONSHARD_ASSIGN_OR_RETURN(const int64_t version, Resolve(from_version));
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<const v1::Plan> from, GetPlan(version));
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanRequest request, store_->GetRequest(version));
  request.mutable_topology()->set_world_size(world_size);
  request.mutable_policy()->set_policy(v1::BALANCED);
  request.mutable_policy()->set_sticky_to(from->content_hash());
  MUONSHARD_RETURN_IF_ERROR(CheckLimits(request));
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanRequest canonical, planner::CanonicalizeRequest(request));
  const std::string hash = planner::ContentHash(canonical);
  if (std::optional<v1::SubmitPlanResponse> existing = Existing(hash)) return *existing;
  // The previous owners as the new plan numbers them; ranks that are gone
  // get a number past the new world, which the planner ignores.
  v1::Plan previous = *from;
  for (v1::RankPlan& r : *previous.mutable_ranks()) {
    const int old = r.rank();
    const int mapped = old < static_cast<int>(new_rank_of.size()) ? new_rank_of[old] : -1;
    r.set_rank(mapped >= 0 ? mapped : world_size + old);
  }
  const absl::Time start = clock_->Now();
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan * computed, planner::ComputePlan(canonical, nullptr, &previous));
  std::shared_ptr<const v1::Plan> plan(computed);
  return Store(canonical, hash, std::move(plan), clock_->Now() - start);
}

absl::StatusOr<v1::SubmitPlanResponse> PlanCatalog::Store(const v1::PlanRequest& canonical, const std::string& hash,
                                                          std::shared_ptr<const v1::Plan> plan,
                                                          absl::Duration compute) {
  absl::MutexLock submit_lock(&submit_mu_);
  MUONSHARD_ASSIGN_OR_RETURN(PlanStore::PutResult put,
                             store_->Put(MakeInfo(hash, clock_->Now(), *plan), canonical, *plan));
  // Not created: an identical request submitted concurrently was stored first.
  if (!put.created) return MakeSubmitResponse(put.info, /*created=*/false);
  const int64_t version = put.info.version();
  {
    absl::MutexLock lock(&mu_);
    index_[version] = put.info;
    by_hash_[hash] = version;
  }
  Cache(version, plan);
  observer_->OnPlanCreated(put.info, compute);
  observer_->OnLatestPlan(put.info, *plan);
  return MakeSubmitResponse(put.info, /*created=*/true);
}

absl::StatusOr<int64_t> PlanCatalog::Resolve(int64_t version) const {
  if (version < 0) {
    return absl::InvalidArgumentError(absl::StrCat("plan version ", version, " is negative"));
  }
  absl::MutexLock lock(&mu_);
  if (index_.empty()) {
    return absl::FailedPreconditionError("no plan has been submitted to this coordinator yet");
  }
  if (version == 0) return index_.rbegin()->first;
  if (index_.count(version) == 0) {
    return absl::NotFoundError(
        absl::StrCat("plan version ", version, " does not exist (latest is ", index_.rbegin()->first, ")"));
  }
  return version;
}

absl::StatusOr<v1::PlanVersionInfo> PlanCatalog::Info(int64_t version) const {
  MUONSHARD_ASSIGN_OR_RETURN(int64_t v, Resolve(version));
  absl::MutexLock lock(&mu_);
  return index_.at(v);
}

int64_t PlanCatalog::latest_version() const {
  absl::MutexLock lock(&mu_);
  return index_.empty() ? 0 : index_.rbegin()->first;
}

std::vector<v1::PlanVersionInfo> PlanCatalog::After(int64_t after, int limit) const {
  std::vector<v1::PlanVersionInfo> out;
  absl::MutexLock lock(&mu_);
  for (auto it = index_.upper_bound(after); it != index_.end() && static_cast<int>(out.size()) < limit; ++it) {
    out.push_back(it->second);
  }
  return out;
}

void PlanCatalog::Cache(int64_t version, std::shared_ptr<const v1::Plan> plan) {
  absl::StatusOr<v1::PlanVersionInfo> info = Info(version);
  if (!info.ok()) return;  // not indexed (cannot happen for a resolved version)
  const int64_t bytes = MemoryEstimate(*plan);
  plans_.Put(version, std::make_shared<const RankViews>(std::move(plan), *info), bytes);
}

absl::StatusOr<std::shared_ptr<const RankViews>> PlanCatalog::Load(int64_t version) {
  if (std::shared_ptr<const RankViews> hit = plans_.Get(version)) return hit;
  absl::MutexLock load_lock(&load_mu_);
  if (std::shared_ptr<const RankViews> hit = plans_.Get(version)) return hit;  // loaded meanwhile
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan plan, store_->GetPlan(version));
  Cache(version, std::make_shared<const v1::Plan>(std::move(plan)));
  std::shared_ptr<const RankViews> loaded = plans_.Get(version);
  if (loaded == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("plan version ", version, " does not fit in the plan cache (--cache-bytes)"));
  }
  return loaded;
}

absl::StatusOr<std::shared_ptr<const v1::Plan>> PlanCatalog::GetPlan(int64_t version) {
  MUONSHARD_ASSIGN_OR_RETURN(int64_t v, Resolve(version));
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<const RankViews> views, Load(v));
  // Aliasing constructor: the plan lives as long as its RankViews.
  return std::shared_ptr<const v1::Plan>(views, &views->plan());
}

absl::StatusOr<SerializedPieces> PlanCatalog::GetResponse(int64_t version, std::optional<int> rank, bool with_request) {
  MUONSHARD_ASSIGN_OR_RETURN(int64_t v, Resolve(version));
  if (rank.has_value()) {
    MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<const RankViews> views, Load(v));
    return views->Response(*rank);
  }
  if (with_request) {
    // Serialized messages concatenate as a merge: the cached plan response
    // followed by a response holding only the request.
    MUONSHARD_ASSIGN_OR_RETURN(SerializedPieces pieces, GetResponse(v, std::nullopt, false));
    v1::GetPlanResponse only_request;
    MUONSHARD_ASSIGN_OR_RETURN(*only_request.mutable_request(), store_->GetRequest(v));
    pieces.push_back(std::make_shared<const std::string>(only_request.SerializeAsString()));
    return pieces;
  }
  if (std::shared_ptr<const std::string> hit = whole_plans_.Get(v)) return SerializedPieces{hit};
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<const v1::Plan> plan, GetPlan(v));
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanVersionInfo info, Info(v));
  // Stored plans leave the display names empty; responses carry them.
  v1::Plan named = *plan;
  planner::AddDisplayNames(&named);
  auto bytes = std::make_shared<const std::string>(SerializeWholePlanResponse(info, named));
  whole_plans_.Put(v, bytes, static_cast<int64_t>(bytes->size()));
  return SerializedPieces{bytes};
}

absl::StatusOr<v1::PlanDiff> PlanCatalog::Diff(int64_t from_version, int64_t to_version, int limit) {
  MUONSHARD_ASSIGN_OR_RETURN(int64_t from_v, Resolve(from_version));
  MUONSHARD_ASSIGN_OR_RETURN(int64_t to_v, Resolve(to_version));
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<const v1::Plan> from, GetPlan(from_v));
  MUONSHARD_ASSIGN_OR_RETURN(std::shared_ptr<const v1::Plan> to, GetPlan(to_v));
  v1::PlanDiff diff = DiffPlans(*from, *to, limit);
  diff.set_from_version(from_v);
  diff.set_to_version(to_v);
  return diff;
}

}  // namespace muonshard::coordinator
