#ifndef MUONSHARD_SIM_CLUSTER_JSON_H_
#define MUONSHARD_SIM_CLUSTER_JSON_H_

// The cluster description file: one JSON object, a preset and the fields it
// overrides (docs/simulator.md, "Cluster files"):
//
//   {"preset": "h200", "nodes": 4,
//    "inter_node": {"bandwidth_gb_s": 100, "latency_us": 5}}
//
// Fields, every one optional: preset, name, gpus_per_node, nodes,
// intra_node and inter_node ({bandwidth_gb_s, efficiency, latency_us}),
// collective_library ("nccl" | "gloo"), algorithm ("auto" | "ring" |
// "tree" | "nvls"), nvls (bool), collective_base_us, gemm_tflops,
// ns_efficiency ([{"min_dim": 1024, "efficiency": 0.32}, ...]),
// ns_call_us, hbm_gb_s,
// hbm_efficiency, kernel_launch_us. Without a preset, every field the
// cluster needs must be given. The preset applies first wherever it stands.
//
// Pure: the caller reads the file.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sim/cluster.h"

namespace muonshard::sim {

// The cluster the text describes, validated (ValidateCluster).
// INVALID_ARGUMENT naming the field: an unknown preset or field, a value of
// the wrong type, one out of range ("cluster.intra_node.bandwidth_gb_s: must
// be > 0, got 0").
absl::StatusOr<ClusterSpec> ParseClusterJson(absl::string_view text);

// Every field of `cluster` in the file's format (no preset): parses back to
// the same cluster.
std::string ClusterToJson(const ClusterSpec& cluster);

// A JSON array of `items` (each a JSON value as text), laid out as
// JsonObjectWriter lays out objects: "[\n item,\n item\n]" ("[]" when empty).
std::string JsonArrayText(const std::vector<std::string>& items);

}  // namespace muonshard::sim

#endif  // MUONSHARD_SIM_CLUSTER_JSON_H_
