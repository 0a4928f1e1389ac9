#ifndef MUONSHARD_PLAN_PLAN_HASH_H_
#define MUONSHARD_PLAN_PLAN_HASH_H_

// The last stage of the plan pipeline (planner.h): hash. The canonical
// request's manifest, topology and policy in, its content hash out, which
// ComputePlan stamps on the plan with the format version.

#include <string>

#include "muonshard/v1/manifest.pb.h"

namespace muonshard::planner {

// "sha256:<hex>" of the deterministic serialization of the PlanRequest with
// these three fields, streamed field by field so the manifest is never
// copied (ContentHash of a canonical request).
std::string RequestHash(const v1::ModelManifest& manifest, const v1::Topology& topology, const v1::PlanPolicy& policy);

}  // namespace muonshard::planner

#endif  // MUONSHARD_PLAN_PLAN_HASH_H_
