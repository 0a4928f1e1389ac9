// The coordinator's handling of requests from outside: CoordinatorService,
// the domain every RPC lands in after the gRPC adapter has decoded it (plans,
// jobs and membership, the rendezvous store, watches). The input is a script
// of requests against one fresh service with an in-memory store and a clock
// that moves only when the script says:
//
//   op byte, then (for requests) a 2-byte little-endian length and that many
//   bytes of the binary request message (fuzz/make_seeds.py writes scripts).
//
// Limits are small (CoordinatorOptions below) so that the limit checks are
// reached; a script runs at most 32 requests. Every request must end in a
// response or a status; checked on top: a plan the service accepts is stored
// valid (ValidatePlan) and serves its first ranks' views, and the service
// still answers reads at the end of the script.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/observer.h"
#include "coordinator/options.h"
#include "coordinator/plan_store.h"
#include "fuzz/fuzz_util.h"
#include "muonshard/v1/coordinator.pb.h"
#include "plan/plan_validator.h"

namespace muonshard::fuzz {
namespace {

using coordinator::CoordinatorService;

class ScriptClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'700'000'000);
};

class NoObserver final : public coordinator::CoordinatorObserver {};

enum Op : uint8_t {
  kSubmitPlan,
  kGetPlan,
  kListPlans,
  kDiffPlans,
  kJoinJob,
  kHeartbeat,
  kLeaveJob,
  kReportError,
  kListWorkers,
  kSetKey,
  kGetKey,
  kWaitKeys,
  kCancelWait,
  kWatch,
  kNext,
  kDropWatcher,
  kAdvanceClock,
  kShutdown,
  kNumOps,
};

coordinator::CoordinatorOptions SmallOptions() {
  coordinator::CoordinatorOptions o;
  o.heartbeat_timeout = absl::Seconds(10);
  o.max_tensors = 256;
  o.max_world_size = 64;
  o.cache_bytes = 1 << 20;
  o.max_key_bytes = 64;
  o.max_value_bytes = 1024;
  o.max_kv_bytes_per_job = 16 << 10;
  o.max_keys_per_wait = 8;
  o.max_waiters = 16;
  o.default_wait = absl::Seconds(30);
  o.max_wait = absl::Minutes(2);
  o.max_watchers = 4;
  o.max_jobs = 4;
  o.job_event_history = 32;
  return o;
}

template <typename Request>
bool Decode(ByteReader& in, Request* request) {
  const absl::string_view bytes = in.Chunk();
  return request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

// A stored plan is valid and serves every rank's view.
void CheckStored(CoordinatorService& service, int64_t version) {
  v1::GetPlanRequest get;
  get.set_version(version);
  auto plan = service.GetPlan(get);
  FUZZ_CHECK(plan.ok(), absl::StrCat("submitted version ", version, " not readable: ", plan.status().ToString()));
  absl::Status valid = planner::ValidatePlan(plan->plan());
  FUZZ_CHECK(valid.ok(), absl::StrCat("stored plan fails ValidatePlan: ", valid.ToString()));
  for (int r = 0; r < plan->plan().topology().world_size() && r < 4; ++r) {
    get.set_rank(r);
    auto view = service.GetPlan(get);
    FUZZ_CHECK(view.ok(), absl::StrCat("no view of rank ", r, ": ", view.status().ToString()));
  }
}

void Run(ByteReader& in) {
  auto store = coordinator::NewInMemoryPlanStore();
  ScriptClock clock;
  NoObserver observer;
  auto service_or = CoordinatorService::Create(store.get(), &clock, SmallOptions(), &observer);
  FUZZ_CHECK(service_or.ok(), service_or.status().ToString());
  std::unique_ptr<CoordinatorService> service = *std::move(service_or);
  std::vector<std::unique_ptr<coordinator::Watcher>> watchers;
  std::vector<uint64_t> waits;
  int completed_waits = 0;
  bool shut_down = false;

  for (int step = 0; step < 32 && !in.empty(); ++step) {
    const uint8_t op = in.Byte() % kNumOps;
    switch (op) {
      case kSubmitPlan: {
        v1::SubmitPlanRequest r;
        if (!Decode(in, &r)) break;
        auto response = service->SubmitPlan(r);
        if (response.ok() && !shut_down) CheckStored(*service, response->version());
        break;
      }
      case kGetPlan: {
        v1::GetPlanRequest r;
        if (Decode(in, &r)) (void)service->GetPlan(r);
        break;
      }
      case kListPlans: {
        v1::ListPlansRequest r;
        if (Decode(in, &r)) (void)service->ListPlans(r);
        break;
      }
      case kDiffPlans: {
        v1::DiffPlansRequest r;
        if (Decode(in, &r)) (void)service->DiffPlans(r);
        break;
      }
      case kJoinJob: {
        v1::JoinJobRequest r;
        if (Decode(in, &r)) (void)service->JoinJob(r);
        break;
      }
      case kHeartbeat: {
        v1::HeartbeatRequest r;
        if (Decode(in, &r)) (void)service->Heartbeat(r);
        break;
      }
      case kLeaveJob: {
        v1::LeaveJobRequest r;
        if (Decode(in, &r)) (void)service->LeaveJob(r);
        break;
      }
      case kReportError: {
        v1::ReportErrorRequest r;
        if (Decode(in, &r)) (void)service->ReportError(r);
        break;
      }
      case kListWorkers: {
        v1::ListWorkersRequest r;
        if (Decode(in, &r)) (void)service->ListWorkers(r);
        break;
      }
      case kSetKey: {
        v1::SetKeyRequest r;
        if (Decode(in, &r)) (void)service->SetKey(r);
        break;
      }
      case kGetKey: {
        v1::GetKeyRequest r;
        if (Decode(in, &r)) (void)service->GetKey(r);
        break;
      }
      case kWaitKeys: {
        v1::WaitKeysRequest r;
        if (!Decode(in, &r)) break;
        auto started =
            service->WaitKeys(r, [&completed_waits](absl::StatusOr<std::vector<std::string>>) { ++completed_waits; });
        if (started.ok() && !started->values.has_value()) waits.push_back(started->id);
        break;
      }
      case kCancelWait:
        if (!waits.empty()) service->CancelWait(waits[in.Byte() % waits.size()]);
        break;
      case kWatch: {
        v1::WatchRequest r;
        if (!Decode(in, &r)) break;
        auto watcher = service->Watch(r, [] {});
        if (watcher.ok()) watchers.push_back(*std::move(watcher));
        break;
      }
      case kNext:
        if (!watchers.empty()) {
          coordinator::Watcher& w = *watchers[in.Byte() % watchers.size()];
          for (int i = 0; i < 16; ++i) {
            auto event = w.Next();
            if (!event.ok() || !event->has_value()) break;
          }
        }
        break;
      case kDropWatcher:
        if (!watchers.empty()) watchers.erase(watchers.begin() + in.Byte() % watchers.size());
        break;
      case kAdvanceClock:
        clock.Advance(absl::Seconds(in.Byte()));
        service->CheckHeartbeats();
        service->ExpireWaits();
        break;
      case kShutdown:
        service->Shutdown();
        shut_down = true;
        break;
      default:
        break;
    }
  }
  auto listed = service->ListWorkers(v1::ListWorkersRequest());
  FUZZ_CHECK(listed.ok(), absl::StrCat("ListWorkers at the end: ", listed.status().ToString()));
  auto plans = service->ListPlans(v1::ListPlansRequest());
  FUZZ_CHECK(plans.ok(), absl::StrCat("ListPlans at the end: ", plans.status().ToString()));
  service->Shutdown();
  watchers.clear();
}

}  // namespace
}  // namespace muonshard::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  muonshard::fuzz::SilenceProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  muonshard::fuzz::ByteReader in(data, size);
  muonshard::fuzz::Run(in);
  return 0;
}
