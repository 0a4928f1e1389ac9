// Plans received from outside: what a worker gets from GetPlan, what a
// checkpoint's plan.pb holds, what `muonshardctl get --output json` prints.
// The input is a binary v1::Plan. ValidatePlan must reject any inconsistent
// one with a status (never crash); on one it accepts, every rank's view must
// extract and display names must fill.

#include <cstddef>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "fuzz/fuzz_util.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/plan_validator.h"
#include "plan/plan_view.h"

namespace {
// Views of at most this many ranks are extracted (each is a copy).
constexpr int kMaxViews = 16;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  muonshard::fuzz::SilenceProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonshard;  // NOLINT: a fuzz entry point
  v1::Plan plan;
  if (!plan.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (!planner::ValidatePlan(plan).ok()) return 0;
  const int world = plan.topology().world_size();
  for (int r = 0; r < world && r < kMaxViews; ++r) {
    auto view = planner::ExtractRankView(plan, r);
    FUZZ_CHECK(view.ok(), absl::StrCat("valid plan, no view of rank ", r, ": ", view.status().ToString()));
  }
  FUZZ_CHECK(!planner::ExtractRankView(plan, world).ok(), "a view of a rank outside the world");
  planner::AddDisplayNames(&plan);
  auto json = ToJson(plan);
  FUZZ_CHECK(json.ok(), json.status().ToString());
  return 0;
}
