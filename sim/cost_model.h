#ifndef MUONSHARD_SIM_COST_MODEL_H_
#define MUONSHARD_SIM_COST_MODEL_H_

// The α-β cost model (docs/simulator.md, "Model"). A collective of n ranks
// over one link class of per-step latency α and bandwidth B (per GPU and
// direction, times its efficiency) on a buffer of S bytes, with L =
// ceil(log2 n):
//
//   NCCL ring   reduce-scatter, all-gather, all-to-all  (n-1)α + (n-1)/n·S/B
//               all-reduce                             2(n-1)α + 2(n-1)/n·S/B
//               reduce, broadcast (pipelined chain)     (n-1)α + S/B
//               gather, scatter (to / from the root)        α + (n-1)/n·S/B
//   NCCL tree   reduce, broadcast                          Lα + S/B
//               all-reduce (double binary tree)           2Lα + 2·S/B
//   NVLS        (inside a node, NVSwitch reductions)
//               all-reduce                                 2α + S/B
//               reduce-scatter, all-gather                  α + (n-1)/n·S/B
//               reduce, broadcast                           α + S/B
//   Gloo        (worker/comm/internal/gloo_ring.h) reduce-scatter, all-gather,
//               all-reduce, all-to-all as the ring; reduce = ring
//               reduce-scatter then gather to the root (two ranks: one
//               send, α + S/B); broadcast =
//               binomial tree L(α + S/B); gather, scatter as above.
//
// Other (algorithm, collective) pairs fall back to the ring. Every call adds
// collective_base_us. With NCCL a group spanning k nodes with m ranks on a
// node goes hierarchically, each level with its own link class and
// algorithm (m rails in parallel between nodes; with inter_node_shared the
// node's one link split m ways):
//   reduce-scatter  intra RS(m, S), inter RS(k, S/m)
//   all-gather      inter AG(k, S/m), intra AG(m, S)
//   all-reduce      intra RS(m, S), inter AR(k, S/m), intra AG(m, S)
//   reduce          intra RS(m, S), inter reduce(k, S/m), intra gather(m, S)
//   broadcast       intra scatter(m, S), inter broadcast(k, S/m), intra AG(m, S)
//   all-to-all      intra and inter parts at once: the slower of
//                   (m-1)α_i + S(m-1)/n/B_i and (k-1)α_e + S(n-m)/n/B_e
//   gather, scatter the root's two links at once: α_e + the slower of
//                   S(m-1)/n/B_i and S(n-m)/n/B_e
// Gloo (the worker's HierarchicalCommunicator, NOTE [Node-local
// collectives] in plan/node_grid.h) on a group that forms a grid:
//   reduce          intra reduce(m, S), then in the root's column inter
//                   reduce(k, S)
//   broadcast       inter broadcast(k, S) in the root's column, intra
//                   broadcast(m, S)
//   reduce-scatter  intra RS(m, S), inter RS(k, S/m) in every column
//   all-gather      inter AG(k, S/m), intra AG(m, S)
//   all-reduce      intra reduce(m, S), inter AR(k, S), intra broadcast(m, S)
// and on any other group spanning nodes flat: the Gloo algorithm over all n
// ranks at the inter-node link's pace, `nodes` of its n ring hops crossing.
// Bytes sent per member (wire bytes) follow the same terms: the bandwidth
// term times B, averaged over the members, booked per link class; the
// simulator books a flat Gloo collective's hop by hop instead (GlooFlatSent:
// a reduce's segments to its root and a broadcast tree's edges cross by
// where the root sits).
//
// Compute: Newton-Schulz flops / (gemm_tflops · NsEfficiency(min_dim, matrices)) +
// ns_call_us per call; element-wise memory_bytes / (hbm_gb_s ·
// hbm_efficiency) + kernel_launch_us per kernel call.

#include <array>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "sim/cluster.h"
#include "sim/step_program.h"

namespace muonshard::sim {

// Where a group's ranks lie.
struct GroupShape {
  int size = 1;
  int nodes = 1;     // distinct nodes
  int per_node = 1;  // most ranks of the group on one node
  // Gloo: the workers run it inside each node first (planner::NodeGridOf
  // of the plan's gpus_per_node is not empty); otherwise rings over all its
  // ranks in rank order. NCCL goes hierarchically whenever it can.
  bool grid = false;
};
// `plan_gpus_per_node`: the plan's Topology.gpus_per_node (0: not known).
GroupShape ShapeOf(const ClusterSpec& cluster, absl::Span<const int> ranks, int plan_gpus_per_node = 0);

// One level: time and bytes each member sends (averaged over members).
struct LevelCost {
  double seconds = 0;
  double bytes_sent = 0;
  Algorithm algorithm = Algorithm::kRing;
};
// `kind` on n ranks over `link` with `algorithm` (kRing / kTree / kNvls; one
// that does not apply to `kind` falls back to the ring), or the library's
// fixed algorithms for Gloo. No per-call base cost. n <= 1: zero.
LevelCost CollectiveLevelCost(CollectiveLibrary library, Algorithm algorithm, OpKind kind, int n, double bytes,
                              const LinkSpec& link);
// The algorithm the cluster uses for `kind` on one level (`intra`: inside a
// node, where NVLS may apply): the cluster's own, or with kAuto the fastest.
// `ways`: collectives crossing between nodes at once on each node (a node's
// columns); with inter_node_shared they split the node's link.
LevelCost BestLevelCost(const ClusterSpec& cluster, OpKind kind, int n, double bytes, bool intra, int ways = 1);

struct CollectiveCost {
  double seconds = 0;
  std::array<double, kLinkClassCount> bytes_sent{};  // per member, averaged
  std::string algorithm;                             // "ring"; hierarchical "ring/tree" (intra/inter)
};
// A collective `kind` on a group of `shape` over a buffer of `bytes`.
CollectiveCost CostOfCollective(const ClusterSpec& cluster, OpKind kind, const GroupShape& shape, double bytes);

// Whether CostOfCollective prices `kind` on `shape` as a flat Gloo
// collective over nodes (its bytes_sent averaged over the members).
bool IsGlooFlat(const ClusterSpec& cluster, OpKind kind, const GroupShape& shape);

// The wire bytes each member of a flat Gloo collective sends per link
// class, hop by hop as worker/comm/internal/gloo_ring.h moves them: ring
// steps to the next member in group order, a reduce's segments to its root
// (two ranks: one send), the binomial broadcast tree's edges, all-to-all's
// and gather's / scatter's even shares. `nodes[i]`: member i's node; `root`:
// the root's group rank (rooted kinds). A hop is inter-node when its two
// members' nodes differ.
std::vector<std::array<double, kLinkClassCount>> GlooFlatSent(OpKind kind, absl::Span<const int> nodes, int root,
                                                              double bytes);

double NewtonSchulzSeconds(const ClusterSpec& cluster, absl::Span<const NsMatrix> matrices);
double ElementwiseSeconds(const ClusterSpec& cluster, int64_t memory_bytes, int calls, bool adamw = false);

}  // namespace muonshard::sim

#endif  // MUONSHARD_SIM_COST_MODEL_H_
