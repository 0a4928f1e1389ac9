#ifndef MUONSHARD_SIM_CLUSTER_H_
#define MUONSHARD_SIM_CLUSTER_H_

// The machine a step is simulated on (docs/simulator.md): nodes of GPUs,
// the links inside a node (NVLink; "node" is the NVLink domain, 72 GPUs on
// an NVL72 rack) and between nodes (InfiniBand / Ethernet, one NIC per GPU),
// how collectives use them, and the rates of the two kinds of compute the
// optimizer does: Newton-Schulz GEMMs and element-wise updates. Ranks fill
// nodes in order: rank r is on node r / gpus_per_node.
//
// Presets (Preset()) carry public figures, each with its source here and in
// docs/simulator.md; a cluster file (sim/cluster_json.h) starts from one and
// overrides fields.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonshard::sim {

enum class LinkClass { kIntraNode = 0, kInterNode = 1 };
constexpr int kLinkClassCount = 2;
// "intra_node", "inter_node".
const char* LinkClassName(LinkClass link);

struct LinkSpec {
  // Nominal bandwidth per GPU and direction, GB/s (1e9 bytes/s): NVLink's
  // "900 GB/s" is both directions, 450 each way.
  double bandwidth_gb_s = 0;
  // The fraction of it a large collective reaches (bus bandwidth / nominal).
  double efficiency = 1;
  // Per algorithm step (one hop of a ring, one level of a tree), us.
  double latency_us = 0;

  double BytesPerSecond() const { return bandwidth_gb_s * 1e9 * efficiency; }
  double LatencySeconds() const { return latency_us * 1e-6; }
};

// Who runs the collectives: NCCL's algorithms, or the worker's Gloo rings
// (worker/comm/internal/gloo_ring.h).
enum class CollectiveLibrary { kNccl, kGloo };
// kAuto: per collective and level, the fastest that applies (NCCL's tuner).
enum class Algorithm { kAuto, kRing, kTree, kNvls };
const char* LibraryName(CollectiveLibrary library);
const char* AlgorithmName(Algorithm algorithm);
absl::StatusOr<CollectiveLibrary> ParseLibrary(absl::string_view name);
absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name);

// Newton-Schulz reaches this fraction of gemm_tflops on matrices whose
// smaller dimension is min_dim (interpolated in log2(min_dim), clamped).
struct NsEfficiencyPoint {
  int64_t min_dim = 0;
  double efficiency = 0;
};

struct ClusterSpec {
  std::string name;
  int gpus_per_node = 0;
  int nodes = 0;  // 0: as many as the plan needs
  LinkSpec intra_node;
  LinkSpec inter_node;
  CollectiveLibrary library = CollectiveLibrary::kNccl;
  Algorithm algorithm = Algorithm::kAuto;
  bool nvls = false;  // NVLink SHARP inside a node (NVSwitch reductions)
  // One link per node that all its GPUs share (inter_node's bandwidth is
  // the node's), not one NIC per GPU: collectives that run on every GPU of
  // a node at once between nodes split it.
  bool inter_node_shared = false;
  double collective_base_us = 0;                 // fixed cost of every collective call
  double gemm_tflops = 0;                        // dense bf16 (fp32 on CPU) per GPU
  std::vector<NsEfficiencyPoint> ns_efficiency;  // ascending min_dim
  // Fixed cost of one Newton-Schulz call (one owned tensor; a 3-D stack is
  // one batched call) besides its FLOPs: launches, norms, the worker's own.
  double ns_call_us = 0;
  double hbm_gb_s = 0;          // memory bandwidth per GPU, GB/s
  double hbm_efficiency = 1;    // fraction element-wise kernels reach
  double kernel_launch_us = 0;  // per element-wise kernel call

  const LinkSpec& link(LinkClass c) const { return c == LinkClass::kIntraNode ? intra_node : inter_node; }
};

// "h100", "h200", "gb200", "gb300", "cpu".
std::vector<std::string> PresetNames();
// The preset (case-insensitive); INVALID_ARGUMENT naming the known ones.
absl::StatusOr<ClusterSpec> Preset(absl::string_view name);

// Every field in range; INVALID_ARGUMENT naming the field
// ("cluster.inter_node.bandwidth_gb_s: must be > 0, got -1").
absl::Status ValidateCluster(const ClusterSpec& cluster);
// A plan of `world_size` ranks fits: world_size <= nodes * gpus_per_node
// when nodes is given. INVALID_ARGUMENT naming nodes otherwise.
absl::Status CheckWorldFits(const ClusterSpec& cluster, int world_size);
// The nodes a plan of `world_size` ranks spans.
int NodesUsed(const ClusterSpec& cluster, int world_size);
int NodeOf(const ClusterSpec& cluster, int rank);

// The NS efficiency for `min_dim` (ns_efficiency interpolated).
double NsEfficiency(const ClusterSpec& cluster, int64_t min_dim);

}  // namespace muonshard::sim

#endif  // MUONSHARD_SIM_CLUSTER_H_
