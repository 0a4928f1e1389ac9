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

// One measured batched Newton-Schulz call: `matrices` same-shape matrices
// whose smaller dimension is min_dim reached `efficiency` of gemm_tflops.
// matrices 0: none measured (a batched call is as efficient as one matrix).
struct NsBatchPoint {
  int64_t matrices = 0;
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
  // the node's, each way), not one NIC per GPU: the columns of one
  // collective split it (sim/cost_model.h), and collectives of several
  // groups at once take turns on it (NOTE [Shared node links]).
  bool inter_node_shared = false;
  double collective_base_us = 0;                 // fixed cost of every collective call
  double gemm_tflops = 0;                        // dense bf16 (fp32 on CPU) per GPU
  std::vector<NsEfficiencyPoint> ns_efficiency;  // ascending min_dim
  // NOTE [Batched NS cost]: what one call of many same-shape matrices gains.
  NsBatchPoint ns_batched;
  // Fixed cost of one Newton-Schulz call (the worker's calls: NOTE [Batched
  // NS cost]) besides its FLOPs: launches, norms, the worker's own.
  double ns_call_us = 0;
  double hbm_gb_s = 0;        // memory bandwidth per GPU, GB/s
  double hbm_efficiency = 1;  // fraction element-wise kernels reach
  // The fraction of that AdamW's kernel reaches: 1 where it is bound by
  // memory (GPUs); on a CPU thread its square root and division per element
  // make it compute-bound (muonshard-bench-kernels' elementwise lines).
  double adamw_efficiency = 1;
  double kernel_launch_us = 0;  // per element-wise kernel call
  // NOTE [Host CPU]: the collective bytes per second one rank's CPU moves,
  // GB/s, when collectives run on the cores the updates run on (Gloo over
  // TCP); 0: collectives take no compute from the rank.
  double host_collective_gb_s = 0;

  const LinkSpec& link(LinkClass c) const { return c == LinkClass::kIntraNode ? intra_node : inter_node; }
};

// NOTE [Host CPU]: on CPU ranks the collectives' copies and the network
// stack run on the cores that run Newton-Schulz and the updates. With
// host_collective_gb_s > 0 a collective takes from each member the CPU time
// of moving its bytes (what the member sends or receives, the larger, over
// that rate), spread evenly over the collective's duration (at most the
// whole CPU); a compute op on that rank runs in what the collectives leave
// it. Collectives go first (the kernel's network stack preempts user
// threads), so they are not slowed; the compute op that shares the CPU
// with them ends later, whichever of the two started first. The sequential
// schedule, whose collectives and compute take turns on one thread, is not
// changed by it; the pipelined one overlaps them only as far as the CPU
// allows.

// NOTE [Shared node links]: with inter_node_shared, each way of a node's
// link is a resource the collectives between nodes load while they run: a
// collective's link time there (the bytes it moves through that way over
// inter_node's rate; a reduce or gather sends what crosses into its root's
// node, a broadcast or scatter out of it, any other collective both ways
// at every member) spread over its duration, at most the whole link. As for
// the host's CPU, the collective that starts first keeps its time; one that
// starts while others load a way of its links runs its link time in what
// they leave (two reduces into one node, each bound by the link, end one
// after the other; into two nodes, at once).

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

// NOTE [Batched NS cost]: the worker runs the same-shape Muon matrices of a
// bucket as one batched Newton-Schulz call (NOTE [Batched Muon] in
// worker/optimizer/internal/bucket_updater.cc), and a GPU reaches more of
// its GEMM rate on a batch of small matrices than on one. A call of
// `matrices` > 1 closes a fraction of the gap between the per-matrix
// efficiency e(min_dim) and the table's best: the fraction ns_batched
// measured, (b - e(b.min_dim)) / (best - e(b.min_dim)) clamped to [0, 1],
// scaled by log2(matrices) / log2(b.matrices) up to 1 (a batch fills the
// GPU's units about as the log of its size, and a batch of 2 gains little).
// One measured point sets it; without one, no gain.

// The NS efficiency of one call of `matrices` matrices of smaller dimension
// `min_dim` (ns_efficiency interpolated; NOTE [Batched NS cost] above 1).
double NsEfficiency(const ClusterSpec& cluster, int64_t min_dim, int64_t matrices = 1);

}  // namespace muonshard::sim

#endif  // MUONSHARD_SIM_CLUSTER_H_
