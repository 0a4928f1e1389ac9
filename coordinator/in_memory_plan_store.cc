// PlanStore in process memory (unit tests). Same semantics and blob encoding
// as SqlitePlanStore; the conformance suite runs against both.
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/blob_codec.h"
#include "coordinator/plan_store.h"

namespace muonshard::coordinator {
namespace {

class InMemoryPlanStore final : public PlanStore {
 public:
  absl::StatusOr<PutResult> Put(v1::PlanVersionInfo info, const v1::PlanRequest& canonical,
                                const v1::Plan& plan) override {
    if (info.content_hash().empty()) return absl::InvalidArgumentError("empty content hash");
    absl::MutexLock lock(&mu_);
    if (auto it = by_hash_.find(info.content_hash()); it != by_hash_.end()) {
      return PutResult{versions_.at(it->second).info, false};
    }
    Record r;
    r.request = EncodeBlob(canonical);
    r.plan = EncodeBlob(plan);
    info.set_version(++last_version_);
    info.set_stored_bytes(static_cast<int64_t>(r.request.size() + r.plan.size()));
    r.info = info;
    by_hash_[info.content_hash()] = info.version();
    versions_[info.version()] = std::move(r);
    return PutResult{std::move(info), true};
  }

  absl::StatusOr<v1::Plan> GetPlan(int64_t version) override {
    v1::Plan plan;
    absl::Status s = Decode(version, /*want_plan=*/true, &plan);
    if (!s.ok()) return s;
    return plan;
  }

  absl::StatusOr<v1::PlanRequest> GetRequest(int64_t version) override {
    v1::PlanRequest request;
    absl::Status s = Decode(version, /*want_plan=*/false, &request);
    if (!s.ok()) return s;
    return request;
  }

  absl::StatusOr<std::vector<v1::PlanVersionInfo>> ListVersions() override {
    absl::MutexLock lock(&mu_);
    std::vector<v1::PlanVersionInfo> out;
    for (const auto& [version, r] : versions_) out.push_back(r.info);
    return out;
  }

  absl::StatusOr<int64_t> LoadGeneration(const std::string& job) override {
    absl::MutexLock lock(&mu_);
    auto it = generations_.find(job);
    return it == generations_.end() ? 0 : it->second;
  }

  absl::Status SaveGeneration(const std::string& job, int64_t generation) override {
    absl::MutexLock lock(&mu_);
    generations_[job] = generation;
    return absl::OkStatus();
  }

  absl::Status ProbeWrite() override { return absl::OkStatus(); }

 private:
  struct Record {
    v1::PlanVersionInfo info;
    std::string request;
    std::string plan;
  };

  absl::Status Decode(int64_t version, bool want_plan, google::protobuf::Message* out) {
    absl::MutexLock lock(&mu_);
    auto it = versions_.find(version);
    if (it == versions_.end()) {
      return absl::NotFoundError(absl::StrCat("plan version ", version, " does not exist"));
    }
    return DecodeBlob(want_plan ? it->second.plan : it->second.request, out, absl::StrCat("plan version ", version));
  }

  absl::Mutex mu_;
  int64_t last_version_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, Record> versions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> by_hash_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> generations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<PlanStore> NewInMemoryPlanStore() { return std::make_unique<InMemoryPlanStore>(); }

}  // namespace muonshard::coordinator
