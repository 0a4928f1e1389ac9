// Model manifests from outside, both encodings: proto3 JSON (`muonshardctl
// plan --manifest m.json`, the Python package) and binary (`m.pb`, the
// manifest inside a SubmitPlan request). Every input is tried both ways.
//
// Checked: what parses round-trips (binary -> deterministic binary -> equal
// message; JSON -> JSON -> equal message), and the planner either plans the
// manifest on a small topology into a plan that validates or says why not.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "fuzz/fuzz_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "muonshard/v1/manifest.pb.h"
#include "muonshard/v1/plan.pb.h"
#include "plan/plan_validator.h"
#include "plan/planner.h"

namespace muonshard::fuzz {
namespace {

constexpr int kMaxTensorsToPlan = 64;

bool Same(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

void PlanOnFourRanks(const v1::ModelManifest& manifest) {
  if (manifest.tensors_size() > kMaxTensorsToPlan) return;
  v1::PlanRequest request;
  *request.mutable_manifest() = manifest;
  request.mutable_topology()->set_world_size(4);
  request.mutable_policy()->set_policy(v1::BALANCED);
  auto plan = planner::ComputePlan(request);
  if (!plan.ok()) return;
  absl::Status valid = planner::ValidatePlan(*plan);
  FUZZ_CHECK(valid.ok(), absl::StrCat("the manifest's plan fails ValidatePlan: ", valid.ToString()));
}

void CheckManifest(const v1::ModelManifest& manifest) { PlanOnFourRanks(manifest); }

}  // namespace
}  // namespace muonshard::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  muonshard::fuzz::SilenceProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonshard;  // NOLINT: a fuzz entry point
  const absl::string_view input(reinterpret_cast<const char*>(data), size);

  v1::ModelManifest binary;
  if (binary.ParseFromArray(data, static_cast<int>(size))) {
    v1::ModelManifest again;
    FUZZ_CHECK(again.ParseFromString(SerializeDeterministic(binary)) && fuzz::Same(binary, again),
               "binary manifest does not round-trip");
    fuzz::CheckManifest(binary);
  }

  v1::ModelManifest json;
  if (FromJson(input, &json, "manifest").ok()) {
    auto printed = ToJson(json);
    FUZZ_CHECK(printed.ok(), printed.status().ToString());
    v1::ModelManifest again;
    absl::Status reparsed = FromJson(*printed, &again, "printed manifest");
    FUZZ_CHECK(reparsed.ok() && fuzz::Same(json, again),
               absl::StrCat("JSON manifest does not round-trip: ", reparsed.ToString()));
    fuzz::CheckManifest(json);
  }
  return 0;
}
