#include "sim/cost_model.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plan/node_grid.h"

namespace muonshard::sim {

GroupShape ShapeOf(const ClusterSpec& cluster, absl::Span<const int> ranks, int plan_gpus_per_node) {
  GroupShape shape;
  const std::vector<int32_t> members(ranks.begin(), ranks.end());
  shape.grid = !planner::NodeGridOf(members, plan_gpus_per_node).empty();
  shape.size = static_cast<int>(ranks.size());
  std::vector<int> nodes;
  nodes.reserve(ranks.size());
  for (int r : ranks) nodes.push_back(NodeOf(cluster, r));
  std::sort(nodes.begin(), nodes.end());
  shape.nodes = 0;
  shape.per_node = 0;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
    ++shape.nodes;
    shape.per_node = std::max(shape.per_node, static_cast<int>(j - i));
    i = j;
  }
  if (shape.nodes == 0) shape = GroupShape{};
  return shape;
}

namespace {

int CeilLog2(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}

bool IsReduceOrBroadcast(OpKind kind) { return kind == OpKind::kReduce || kind == OpKind::kBroadcast; }

bool TreeApplies(OpKind kind) { return IsReduceOrBroadcast(kind) || kind == OpKind::kAllReduce; }

bool NvlsApplies(OpKind kind) {
  return TreeApplies(kind) || kind == OpKind::kReduceScatter || kind == OpKind::kAllGather;
}

LevelCost Ring(OpKind kind, int n, double s, const LinkSpec& link) {
  const double a = link.LatencySeconds();
  const double b = link.BytesPerSecond();
  const double frac = (n - 1.0) / n;
  switch (kind) {
    case OpKind::kAllReduce:
      return {2 * (n - 1) * a + 2 * frac * s / b, 2 * frac * s, Algorithm::kRing};
    case OpKind::kReduce:
    case OpKind::kBroadcast:
      return {(n - 1) * a + s / b, frac * s, Algorithm::kRing};
    case OpKind::kGather:
    case OpKind::kScatter:
      return {a + frac * s / b, frac * s / n, Algorithm::kRing};
    default:  // reduce-scatter, all-gather, all-to-all
      return {(n - 1) * a + frac * s / b, frac * s, Algorithm::kRing};
  }
}

LevelCost Tree(OpKind kind, int n, double s, const LinkSpec& link) {
  const double a = link.LatencySeconds();
  const double b = link.BytesPerSecond();
  const double frac = (n - 1.0) / n;
  const int levels = CeilLog2(n);
  if (IsReduceOrBroadcast(kind)) return {levels * a + s / b, frac * s, Algorithm::kTree};
  if (kind == OpKind::kAllReduce) return {2 * levels * a + 2 * s / b, 2 * frac * s, Algorithm::kTree};
  return Ring(kind, n, s, link);
}

LevelCost Nvls(OpKind kind, int n, double s, const LinkSpec& link) {
  const double a = link.LatencySeconds();
  const double b = link.BytesPerSecond();
  const double frac = (n - 1.0) / n;
  if (kind == OpKind::kAllReduce) return {2 * a + s / b, s, Algorithm::kNvls};
  if (IsReduceOrBroadcast(kind)) return {a + s / b, frac * s, Algorithm::kNvls};
  if (NvlsApplies(kind)) return {a + frac * s / b, frac * s, Algorithm::kNvls};
  return Ring(kind, n, s, link);
}

// The worker's Gloo collectives (worker/comm/internal/gloo_ring.h).
LevelCost Gloo(OpKind kind, int n, double s, const LinkSpec& link) {
  const double a = link.LatencySeconds();
  const double b = link.BytesPerSecond();
  const double frac = (n - 1.0) / n;
  if (kind == OpKind::kReduce && n == 2) return {a + s / b, s / 2, Algorithm::kRing};  // one send to the root
  if (kind == OpKind::kReduce) {  // ring reduce-scatter, then segments to the root
    return {n * a + 2 * frac * s / b, frac * s + frac * s / n, Algorithm::kRing};
  }
  if (kind == OpKind::kBroadcast) {  // binomial tree of whole-buffer transfers
    return {CeilLog2(n) * (a + s / b), frac * s, Algorithm::kTree};
  }
  return Ring(kind, n, s, link);
}

}  // namespace

LevelCost CollectiveLevelCost(CollectiveLibrary library, Algorithm algorithm, OpKind kind, int n, double bytes,
                              const LinkSpec& link) {
  if (n <= 1 || !IsCollective(kind)) return {};
  if (library == CollectiveLibrary::kGloo) return Gloo(kind, n, bytes, link);
  switch (algorithm) {
    case Algorithm::kTree:
      return Tree(kind, n, bytes, link);
    case Algorithm::kNvls:
      return Nvls(kind, n, bytes, link);
    default:
      return Ring(kind, n, bytes, link);
  }
}

LevelCost BestLevelCost(const ClusterSpec& cluster, OpKind kind, int n, double bytes, bool intra, int ways) {
  LinkSpec link = intra ? cluster.intra_node : cluster.inter_node;
  if (!intra && cluster.inter_node_shared && ways > 1) link.bandwidth_gb_s /= ways;
  const bool nvls = intra && cluster.nvls && NvlsApplies(kind);
  if (cluster.library == CollectiveLibrary::kGloo || cluster.algorithm != Algorithm::kAuto) {
    Algorithm a = cluster.algorithm;
    if (a == Algorithm::kNvls && !nvls) a = Algorithm::kRing;
    return CollectiveLevelCost(cluster.library, a, kind, n, bytes, link);
  }
  LevelCost best = CollectiveLevelCost(cluster.library, Algorithm::kRing, kind, n, bytes, link);
  std::vector<Algorithm> others;
  if (TreeApplies(kind)) others.push_back(Algorithm::kTree);
  if (nvls) others.push_back(Algorithm::kNvls);
  for (Algorithm a : others) {
    LevelCost c = CollectiveLevelCost(cluster.library, a, kind, n, bytes, link);
    if (c.seconds < best.seconds) best = c;
  }
  return best;
}

namespace {

std::string LevelName(const ClusterSpec& cluster, Algorithm algorithm) {
  return cluster.library == CollectiveLibrary::kGloo ? "gloo" : AlgorithmName(algorithm);
}

struct Part {
  OpKind kind;
  bool intra;
  int n;
  double bytes;
  int ways = 1;        // columns crossing between nodes at once (inter_node_shared splits the link)
  double share = 1.0;  // of the group's members that take part
};

// The levels of a collective on k nodes of m ranks each (both > 1).
std::vector<Part> HierarchicalParts(OpKind kind, int m, int k, double s) {
  switch (kind) {
    case OpKind::kReduceScatter:
      return {{kind, true, m, s}, {kind, false, k, s / m, m}};
    case OpKind::kAllGather:
      return {{kind, false, k, s / m, m}, {kind, true, m, s}};
    case OpKind::kAllReduce:
      return {{OpKind::kReduceScatter, true, m, s}, {kind, false, k, s / m, m}, {OpKind::kAllGather, true, m, s}};
    case OpKind::kReduce:
      return {{OpKind::kReduceScatter, true, m, s}, {kind, false, k, s / m, m}, {OpKind::kGather, true, m, s}};
    default:  // broadcast
      return {{OpKind::kScatter, true, m, s}, {kind, false, k, s / m, m}, {OpKind::kAllGather, true, m, s}};
  }
}

// The Gloo workers' levels on a grid (HierarchicalCommunicator): reductions
// and broadcasts cross between nodes in the root's column only;
// reduce-scatter and all-gather are NCCL's levels.
std::vector<Part> GlooGridParts(OpKind kind, int m, int k, double s) {
  const double column = 1.0 / m;
  switch (kind) {
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
      return HierarchicalParts(kind, m, k, s);
    case OpKind::kAllReduce:
      return {{OpKind::kReduce, true, m, s}, {kind, false, k, s, 1, column}, {OpKind::kBroadcast, true, m, s}};
    case OpKind::kReduce:
      return {{kind, true, m, s}, {kind, false, k, s, 1, column}};
    default:  // broadcast
      return {{kind, false, k, s, 1, column}, {kind, true, m, s}};
  }
}

// Intra- and inter-node parts at once: all-to-all (every member's) and
// gather / scatter (the root's).
CollectiveCost Concurrent(const ClusterSpec& c, OpKind kind, const GroupShape& shape, double s) {
  const double n = shape.size;
  const double m = shape.per_node;
  const LinkSpec& in = c.intra_node;
  const LinkSpec& out = c.inter_node;
  CollectiveCost cost;
  if (kind == OpKind::kAllToAll) {
    cost.seconds = std::max((m - 1) * in.LatencySeconds() + s * (m - 1) / n / in.BytesPerSecond(),
                            (shape.nodes - 1) * out.LatencySeconds() + s * (n - m) / n / out.BytesPerSecond());
    cost.bytes_sent = {s * (m - 1) / n, s * (n - m) / n};
  } else {
    cost.seconds =
        out.LatencySeconds() + std::max(s * (m - 1) / n / in.BytesPerSecond(), s * (n - m) / n / out.BytesPerSecond());
    cost.bytes_sent = {s * (m - 1) / (n * n), s * (n - m) / (n * n)};
  }
  cost.algorithm = LevelName(c, Algorithm::kRing);
  return cost;
}

// A flat Gloo collective over a group spanning nodes: its rings and trees
// run at the pace of the slowest hop, between nodes; `nodes` of its n ring
// hops (rank order, contiguous per node) cross.
CollectiveCost GlooFlat(const ClusterSpec& c, OpKind kind, const GroupShape& shape, double s) {
  const LevelCost level = BestLevelCost(c, kind, shape.size, s, /*intra=*/false);
  const double crossing = static_cast<double>(shape.nodes) / shape.size;
  CollectiveCost cost;
  cost.seconds = level.seconds;
  cost.bytes_sent = {level.bytes_sent * (1 - crossing), level.bytes_sent * crossing};
  cost.algorithm = "gloo flat";
  return cost;
}

CollectiveCost Hierarchical(const ClusterSpec& c, OpKind kind, const GroupShape& shape, double s) {
  const bool gloo = c.library == CollectiveLibrary::kGloo;
  if (kind == OpKind::kAllToAll || kind == OpKind::kGather || kind == OpKind::kScatter) {
    return Concurrent(c, kind, shape, s);  // NCCL (Gloo's run flat: IsGlooFlat)
  }
  CollectiveCost cost;
  std::string intra_name, inter_name;
  const std::vector<Part> parts = gloo ? GlooGridParts(kind, shape.per_node, shape.nodes, s)
                                       : HierarchicalParts(kind, shape.per_node, shape.nodes, s);
  for (const Part& p : parts) {
    const LevelCost level = BestLevelCost(c, p.kind, p.n, p.bytes, p.intra, p.ways);
    cost.seconds += level.seconds;
    cost.bytes_sent[p.intra ? 0 : 1] += level.bytes_sent * p.share;
    std::string& name = p.intra ? intra_name : inter_name;
    if (name.empty()) name = LevelName(c, level.algorithm);
  }
  cost.algorithm = absl::StrCat(intra_name, "/", inter_name);
  return cost;
}

}  // namespace

CollectiveCost CostOfCollective(const ClusterSpec& cluster, OpKind kind, const GroupShape& shape, double bytes) {
  if (shape.size <= 1 || !IsCollective(kind)) return {};
  CollectiveCost cost;
  if (shape.nodes <= 1 || shape.per_node <= 1) {
    const bool intra = shape.nodes <= 1;
    const LevelCost level = BestLevelCost(cluster, kind, shape.size, bytes, intra);
    cost.seconds = level.seconds;
    cost.bytes_sent[intra ? 0 : 1] = level.bytes_sent;
    cost.algorithm = LevelName(cluster, level.algorithm);
  } else if (IsGlooFlat(cluster, kind, shape)) {
    cost = GlooFlat(cluster, kind, shape, bytes);
  } else {
    cost = Hierarchical(cluster, kind, shape, bytes);
  }
  cost.seconds += cluster.collective_base_us * 1e-6;
  return cost;
}

bool IsGlooFlat(const ClusterSpec& cluster, OpKind kind, const GroupShape& shape) {
  if (cluster.library != CollectiveLibrary::kGloo || shape.size <= 1 || !IsCollective(kind)) return false;
  if (shape.nodes <= 1 || shape.per_node <= 1) return false;
  return !shape.grid || kind == OpKind::kAllToAll || kind == OpKind::kGather || kind == OpKind::kScatter;
}

namespace {

// Adds `bytes` to what member `from` sends, on the class of its hop to `to`.
void Hop(std::vector<std::array<double, kLinkClassCount>>& sent, absl::Span<const int> nodes, int from, int to,
         double bytes) {
  sent[from][nodes[from] == nodes[to] ? 0 : 1] += bytes;
}

}  // namespace

std::vector<std::array<double, kLinkClassCount>> GlooFlatSent(OpKind kind, absl::Span<const int> nodes, int root,
                                                              double s) {
  const int n = static_cast<int>(nodes.size());
  std::vector<std::array<double, kLinkClassCount>> sent(n, std::array<double, kLinkClassCount>{});
  if (n <= 1) return sent;
  const double frac = (n - 1.0) / n;
  for (int i = 0; i < n; ++i) {
    const int right = (i + 1) % n;
    switch (kind) {
      case OpKind::kReduceScatter:
      case OpKind::kAllGather:
        Hop(sent, nodes, i, right, frac * s);
        break;
      case OpKind::kAllReduce:
        Hop(sent, nodes, i, right, 2 * frac * s);
        break;
      case OpKind::kReduce:
        if (n == 2) {
          if (i != root) Hop(sent, nodes, i, root, s);
          break;
        }
        Hop(sent, nodes, i, right, frac * s);
        if (i != root) Hop(sent, nodes, i, root, s / n);
        break;
      case OpKind::kBroadcast: {
        // Relative rank me; children me + mask below its lowest set bit.
        const int me = (i - root + n) % n;
        int mask = 1;
        while (mask < n && !(me & mask)) mask <<= 1;
        for (mask >>= 1; mask > 0; mask >>= 1) {
          if (me + mask < n) Hop(sent, nodes, i, (me + mask + root) % n, s);
        }
        break;
      }
      case OpKind::kAllToAll:
        for (int j = 0; j < n; ++j) {
          if (j != i) Hop(sent, nodes, i, j, s / n);
        }
        break;
      case OpKind::kGather:
        if (i != root) Hop(sent, nodes, i, root, s / n);
        break;
      case OpKind::kScatter:
        if (i == root) {
          for (int j = 0; j < n; ++j) {
            if (j != root) Hop(sent, nodes, root, j, s / n);
          }
        }
        break;
      default:
        break;
    }
  }
  return sent;
}

double NewtonSchulzSeconds(const ClusterSpec& cluster, absl::Span<const NsMatrix> matrices) {
  double seconds = 0;
  for (const NsMatrix& m : matrices) {
    seconds += m.flops / (cluster.gemm_tflops * 1e12 * NsEfficiency(cluster, m.min_dim, m.count));
    seconds += cluster.ns_call_us * 1e-6;
  }
  return seconds;
}

double ElementwiseSeconds(const ClusterSpec& cluster, int64_t memory_bytes, int calls, bool adamw) {
  const double rate = cluster.hbm_gb_s * 1e9 * cluster.hbm_efficiency * (adamw ? cluster.adamw_efficiency : 1.0);
  return memory_bytes / rate + calls * cluster.kernel_launch_us * 1e-6;
}

}  // namespace muonshard::sim
