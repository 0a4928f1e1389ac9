// Plan requests -> the planner: what SubmitPlan and `muonshardctl plan` do
// with a request from outside. The input is a v1::PlanRequest, proto3 JSON
// when it starts with '{' (the CLI's files), binary otherwise (the RPC).
//
// Checked on every request the planner accepts:
//   ComputePlan's result passes ValidatePlan (the invariants workers check);
//   its content hash is ContentHash of the canonical request;
//   the same request planned twice gives byte-identical plans;
//   the views of the first ranks and of the last one can be extracted;
//   a sticky re-plan (the coordinator's resize: BALANCED, sticky_to the
//   plan, another world size, ranks renumbered) validates too.
// Requests beyond fuzz-sized limits (64 tensors, 64 ranks) are skipped, as
// the coordinator turns away those beyond --max-tensors / --max-world-size
// before planning: the limits keep an execution short, not the logic small.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "fuzz/fuzz_util.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/plan_validator.h"
#include "plan/plan_view.h"
#include "plan/planner.h"

namespace muonshard::fuzz {
namespace {

constexpr int kMaxTensors = 64;
constexpr int kMaxWorld = 64;
constexpr int kMaxPatterns = 16;
// Twice-planned comparison only for small requests (it doubles the cost).
constexpr int kMaxTensorsForDeterminism = 16;
// Views extracted: the first ranks and the last one.
constexpr int kMaxViews = 8;

bool WithinLimits(const v1::PlanRequest& r) {
  return r.manifest().tensors_size() <= kMaxTensors && r.topology().world_size() <= kMaxWorld &&
         r.policy().muon_exclude_patterns_size() <= kMaxPatterns;
}

void CheckPlan(const v1::Plan& plan, const std::string& what) {
  absl::Status valid = planner::ValidatePlan(plan);
  FUZZ_CHECK(valid.ok(), absl::StrCat(what, " fails ValidatePlan: ", valid.ToString()));
  const int world = plan.topology().world_size();
  for (int r = 0; r < world; r = (r + 1 == kMaxViews && world > kMaxViews) ? world - 1 : r + 1) {
    auto view = planner::ExtractRankView(plan, r);
    FUZZ_CHECK(view.ok(), absl::StrCat(what, ": no view of rank ", r, ": ", view.status().ToString()));
  }
}

// The coordinator's resize (PlanCatalog::Resize): BALANCED, sticky to
// `from`, `world` ranks; old ranks past the new world get numbers past it.
void StickyReplan(const v1::PlanRequest& canonical, const v1::Plan& from, int world) {
  v1::PlanRequest request = canonical;
  request.mutable_topology()->set_world_size(world);
  request.mutable_policy()->set_policy(v1::BALANCED);
  request.mutable_policy()->set_sticky_to(from.content_hash());
  auto resized = planner::CanonicalizeRequest(request);
  if (!resized.ok()) return;
  v1::Plan previous = from;
  for (v1::RankPlan& r : *previous.mutable_ranks()) {
    if (r.rank() >= world) r.set_rank(world + r.rank());
  }
  auto plan = planner::ComputePlan(*resized, nullptr, &previous);
  if (!plan.ok()) return;
  std::unique_ptr<v1::Plan> owned(*plan);
  CheckPlan(*owned, absl::StrCat("sticky re-plan to ", world, " ranks"));
}

}  // namespace
}  // namespace muonshard::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  muonshard::fuzz::SilenceProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonshard;  // NOLINT: a fuzz entry point
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  v1::PlanRequest request;
  if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(input), "{")) {
    if (!FromJson(input, &request, "plan request").ok()) return 0;
  } else if (!request.ParseFromArray(data, static_cast<int>(size))) {
    return 0;
  }
  if (!fuzz::WithinLimits(request)) return 0;

  auto canonical = planner::CanonicalizeRequest(request);
  if (!canonical.ok()) return 0;
  auto plan = planner::ComputePlan(*canonical);
  if (!plan.ok()) return 0;
  fuzz::CheckPlan(*plan, "plan");
  FUZZ_CHECK(plan->content_hash() == planner::ContentHash(*canonical), "content hash of the canonical request");
  // The uncanonical request plans to the same plan (ComputePlan canonicalizes).
  auto direct = planner::ComputePlan(request);
  FUZZ_CHECK(direct.ok(), absl::StrCat("canonical request plans, raw one fails: ", direct.status().ToString()));
  if (request.manifest().tensors_size() <= fuzz::kMaxTensorsForDeterminism) {
    FUZZ_CHECK(SerializeDeterministic(*direct) == SerializeDeterministic(*plan), "planning is not deterministic");
  }
  if (canonical->policy().sticky_to().empty()) {
    // One step of pp x ep ranks less (or more), so the layout still divides.
    const v1::Topology& t = plan->topology();
    const int step = t.pp() * t.ep();
    fuzz::StickyReplan(*canonical, *plan, t.world_size() > step ? t.world_size() - step : t.world_size() + step);
  }
  return 0;
}
