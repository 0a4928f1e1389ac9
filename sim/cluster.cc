#include "sim/cluster.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace muonshard::sim {

const char* LinkClassName(LinkClass link) { return link == LinkClass::kIntraNode ? "intra_node" : "inter_node"; }

const char* LibraryName(CollectiveLibrary library) { return library == CollectiveLibrary::kNccl ? "nccl" : "gloo"; }

const char* AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kNvls:
      return "nvls";
  }
  return "unknown";
}

absl::StatusOr<CollectiveLibrary> ParseLibrary(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "nccl") return CollectiveLibrary::kNccl;
  if (n == "gloo") return CollectiveLibrary::kGloo;
  return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is not one of nccl, gloo"));
}

absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kTree, Algorithm::kNvls}) {
    if (n == AlgorithmName(a)) return a;
  }
  return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is not one of auto, ring, tree, nvls"));
}

namespace {

// ---- preset figures (docs/simulator.md, "Presets", lists the same sources)

// NCCL's own cost model (NVIDIA/nccl src/graph/tuning.cc, Ring/Simple):
// baseLat 8.4 us per call; hwLat 3.4 us per step over NVLink, 9.6 us over
// the network.
constexpr double kNcclBaseUs = 8.4;
constexpr double kNvlinkStepUs = 3.4;
constexpr double kNetStepUs = 9.6;
// Assumptions, not datasheet figures: the fraction of nominal bandwidth a
// large NCCL collective reaches (ring all-reduce bus bandwidth ~360 GB/s of
// NVLink 4's 450 GB/s per direction; ~45 of NDR's 50 GB/s), and of HBM
// bandwidth an element-wise kernel reaches.
constexpr double kNvlinkEfficiency = 0.8;
constexpr double kNetEfficiency = 0.9;
constexpr double kHbmEfficiency = 0.8;
constexpr double kGpuLaunchUs = 4;
// The worker's Newton-Schulz call on the GPU beyond its FLOPs:
// docs/benchmarks.md, "The worker on the GPU": tiny-moe at world size 1,
// 112 matrices of 128x256 and 256x256, orthogonalise 12.2 ms (bf16) where
// the FLOP term gives ~0.3 ms: ~105 us per matrix (launch-bound). Measured
// on the H200 only; used for every GPU preset.
constexpr double kGpuNsCallUs = 105;

// NS5 bf16 on one H200 against its dense bf16 peak (989 TFLOP/s), by the
// smaller matrix dimension: docs/benchmarks.md, "GPU" / "Kernels and NCCL"
// (2026-11-30): 1024 0.27-0.37 (1024^2, 4096x1024), 2048 0.61-0.68 (2048^2,
// 2048x8192), 4096 0.78-0.79 (4096^2, 14336x4096), 8192 0.88 (8192^2).
// Below 1024 extrapolated (launch-bound: halving per halving); the batched
// stack of 64 experts 768x2048 measured 0.55, above this per-matrix table.
// Used for every GPU preset (no other GPU was measured).
std::vector<NsEfficiencyPoint> GpuNsEfficiency() {
  return {{128, 0.04}, {256, 0.08}, {512, 0.16}, {1024, 0.32}, {2048, 0.64}, {4096, 0.78}, {8192, 0.88}};
}

// NOTE [Batched NS cost]: the same H200 run, 64 experts of 768x2048 in one
// batched call: 547.7 TFLOP/s = 0.554 of 989, where the table gives 0.254
// for min_dim 768 (a fraction 0.48 of the gap to 0.88).
constexpr NsBatchPoint kGpuNsBatched = {64, 768, 0.554};

ClusterSpec HopperNode(const char* name, double hbm_gb_s) {
  ClusterSpec c;
  c.name = name;
  c.gpus_per_node = 8;  // HGX / DGX H100 and H200: 8 GPUs on NVSwitch
  // NVLink 4: 900 GB/s per GPU, both directions (H100 and H200 datasheets).
  c.intra_node = {450, kNvlinkEfficiency, kNvlinkStepUs};
  // One ConnectX-7 NDR 400 Gb/s InfiniBand port per GPU (DGX H100/H200
  // user guide): 50 GB/s each way.
  c.inter_node = {50, kNetEfficiency, kNetStepUs};
  c.nvls = true;  // third-generation NVSwitch: NVLink SHARP
  c.collective_base_us = kNcclBaseUs;
  // H100 / H200 SXM datasheets: BF16 Tensor Core 1,979 TFLOP/s with
  // sparsity, 989 dense.
  c.gemm_tflops = 989;
  c.ns_efficiency = GpuNsEfficiency();
  c.ns_batched = kGpuNsBatched;
  c.ns_call_us = kGpuNsCallUs;
  c.hbm_gb_s = hbm_gb_s;
  c.hbm_efficiency = kHbmEfficiency;
  c.kernel_launch_us = kGpuLaunchUs;
  return c;
}

ClusterSpec Nvl72Rack(const char* name, double nic_gb_s) {
  ClusterSpec c;
  c.name = name;
  // GB200 / GB300 NVL72: one NVLink domain of 72 GPUs (18 trays of 4).
  c.gpus_per_node = 72;
  // NVLink 5: 1.8 TB/s per GPU both directions (NVL72 datasheets: 130 TB/s
  // for 72 GPUs), 900 GB/s each way.
  c.intra_node = {900, kNvlinkEfficiency, kNvlinkStepUs};
  c.inter_node = {nic_gb_s, kNetEfficiency, kNetStepUs};
  c.nvls = true;
  c.collective_base_us = kNcclBaseUs;
  // GB200 / GB300 NVL72 datasheets: FP16/BF16 Tensor Core 360 PFLOP/s with
  // sparsity for 72 GPUs: 2.5 PFLOP/s dense per GPU (HGX B200 lists 2.25).
  c.gemm_tflops = 2500;
  c.ns_efficiency = GpuNsEfficiency();
  c.ns_batched = kGpuNsBatched;
  c.ns_call_us = kGpuNsCallUs;
  // HBM3e 576 TB/s for 72 GPUs (both datasheets): 8 TB/s per GPU.
  c.hbm_gb_s = 8000;
  c.hbm_efficiency = kHbmEfficiency;
  c.kernel_launch_us = kGpuLaunchUs;
  return c;
}

// Ranks as processes on one host, Gloo over TCP, OpenBLAS fp32: the
// project's CPU machines (docs/benchmarks.md). A node is the host; with
// gpus_per_node 1 every rank is a node of its own, as in
// bench/worker/shaped_net.py's one network namespace per rank.
ClusterSpec CpuHost() {
  ClusterSpec c;
  c.name = "cpu";
  c.gpus_per_node = 64;
  // Loopback: "Gloo collectives", 4 ranks, ring reduce-scatter of 3.146 MB
  // per rank in 6.3-7.2 ms: ~0.5 GB/s per rank. Per step ~15 us (half the
  // ~30 us round trip "Step overlap on a shaped network" measured).
  c.intra_node = {0.5, 1.0, 15};
  // The shaped link (tc htb, 2 Gbit/s): 1.88-1.90 Gbit/s of payload.
  c.inter_node = {0.236, 1.0, 15};
  c.library = CollectiveLibrary::kGloo;
  c.collective_base_us = 20;  // assumption: a Gloo call's fixed cost
  // "NS5 against sgemm": cblas_sgemm 197.8 GFLOP/s at 4096x1024; NS5
  // 44.4 GFLOP/s on 64 x 128x512, 102.1 on 1024^2, 109.5 on 2048^2.
  c.gemm_tflops = 0.2;
  c.ns_efficiency = {{128, 0.22}, {1024, 0.51}, {2048, 0.55}};
  // No ns_batched: the 128 point is itself a batch of 64, and
  // MuonUpdateBatch's gain over per-matrix calls here (0.97-1.33x,
  // "MuonUpdateBatch") is within the runs' spread.
  // muonshard-bench-kernels' elementwise lines, 2 threads (2026-12-07, AMD
  // EPYC VM): Muon's momentum + apply 18.9 GB/s, AdamW 9.3 (compute-bound),
  // 0.04-0.09 us per element-wise call, 4.1 us per Muon call of 8 x 8.
  c.ns_call_us = 4.1;
  c.hbm_gb_s = 18.9;
  c.hbm_efficiency = 1.0;
  c.adamw_efficiency = 0.49;
  c.kernel_launch_us = 0.06;
  // NOTE [Host CPU]: loopback rings are bound by the ranks' CPUs, so the
  // loopback rate above is what a rank's CPU moves.
  c.host_collective_gb_s = 0.5;
  return c;
}

}  // namespace

std::vector<std::string> PresetNames() { return {"h100", "h200", "gb200", "gb300", "cpu"}; }

absl::StatusOr<ClusterSpec> Preset(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  // H100 SXM datasheet: 3.35 TB/s HBM3; H200 SXM datasheet: 4.8 TB/s HBM3e.
  if (n == "h100") return HopperNode("h100", 3350);
  if (n == "h200") return HopperNode("h200", 4800);
  // NICs: GB200 NVL72 with ConnectX-7 NDR 400 Gb/s per GPU; GB300 NVL72
  // with ConnectX-8 800 Gb/s (XDR InfiniBand) per GPU.
  if (n == "gb200") return Nvl72Rack("gb200", 50);
  if (n == "gb300") return Nvl72Rack("gb300", 100);
  if (n == "cpu") return CpuHost();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cluster preset \"", name, "\" (known: ", absl::StrJoin(PresetNames(), ", "), ")"));
}

namespace {

absl::Status Positive(const std::string& field, double value) {
  if (value > 0 && std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("cluster.", field, ": must be > 0, got ", value));
}

absl::Status NonNegative(const std::string& field, double value) {
  if (value >= 0 && std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("cluster.", field, ": must be >= 0, got ", value));
}

absl::Status Fraction(const std::string& field, double value, double max) {
  if (value > 0 && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("cluster.", field, ": must be in (0, ", max, "], got ", value));
}

absl::Status CheckLink(const std::string& name, const LinkSpec& link) {
  MUONSHARD_RETURN_IF_ERROR(Positive(name + ".bandwidth_gb_s", link.bandwidth_gb_s));
  MUONSHARD_RETURN_IF_ERROR(Fraction(name + ".efficiency", link.efficiency, 1));
  return NonNegative(name + ".latency_us", link.latency_us);
}

absl::Status CheckNsTable(const std::vector<NsEfficiencyPoint>& table) {
  if (table.empty()) return absl::InvalidArgumentError("cluster.ns_efficiency: needs at least one point");
  for (size_t i = 0; i < table.size(); ++i) {
    const std::string field = absl::StrCat("ns_efficiency[", i, "]");
    if (table[i].min_dim < 1 || (i > 0 && table[i].min_dim <= table[i - 1].min_dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster.", field, ".min_dim: must be >= 1 and ascending, got ", table[i].min_dim));
    }
    // A fraction of gemm_tflops; above 1 where NS beats the plain GEMM
    // (symmetric products), never far above.
    MUONSHARD_RETURN_IF_ERROR(Fraction(field + ".efficiency", table[i].efficiency, 2));
  }
  return absl::OkStatus();
}

absl::Status CheckNsBatch(const NsBatchPoint& b) {
  if (b.matrices == 0 && b.min_dim == 0 && b.efficiency == 0) return absl::OkStatus();  // none
  if (b.matrices < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster.ns_batched.matrices: must be >= 2 (or the whole point 0: none), got ", b.matrices));
  }
  if (b.min_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.ns_batched.min_dim: must be >= 1, got ", b.min_dim));
  }
  return Fraction("ns_batched.efficiency", b.efficiency, 2);
}

}  // namespace

absl::Status ValidateCluster(const ClusterSpec& c) {
  if (c.gpus_per_node < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.gpus_per_node: must be >= 1, got ", c.gpus_per_node));
  }
  if (c.nodes < 0) return absl::InvalidArgumentError(absl::StrCat("cluster.nodes: must be >= 0, got ", c.nodes));
  MUONSHARD_RETURN_IF_ERROR(CheckLink("intra_node", c.intra_node));
  MUONSHARD_RETURN_IF_ERROR(CheckLink("inter_node", c.inter_node));
  MUONSHARD_RETURN_IF_ERROR(NonNegative("collective_base_us", c.collective_base_us));
  MUONSHARD_RETURN_IF_ERROR(Positive("gemm_tflops", c.gemm_tflops));
  MUONSHARD_RETURN_IF_ERROR(CheckNsTable(c.ns_efficiency));
  MUONSHARD_RETURN_IF_ERROR(CheckNsBatch(c.ns_batched));
  MUONSHARD_RETURN_IF_ERROR(NonNegative("ns_call_us", c.ns_call_us));
  MUONSHARD_RETURN_IF_ERROR(Positive("hbm_gb_s", c.hbm_gb_s));
  MUONSHARD_RETURN_IF_ERROR(Fraction("hbm_efficiency", c.hbm_efficiency, 1));
  MUONSHARD_RETURN_IF_ERROR(Fraction("adamw_efficiency", c.adamw_efficiency, 1));
  MUONSHARD_RETURN_IF_ERROR(NonNegative("kernel_launch_us", c.kernel_launch_us));
  return NonNegative("host_collective_gb_s", c.host_collective_gb_s);
}

absl::Status CheckWorldFits(const ClusterSpec& c, int world_size) {
  if (c.nodes == 0 || static_cast<int64_t>(c.nodes) * c.gpus_per_node >= world_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("cluster.nodes: the plan's world size ", world_size, " does not fit ",
                                                 c.nodes, " node(s) x ", c.gpus_per_node, " GPUs per node (",
                                                 static_cast<int64_t>(c.nodes) * c.gpus_per_node, " ranks)"));
}

int NodesUsed(const ClusterSpec& c, int world_size) {
  return std::max(1, (world_size + c.gpus_per_node - 1) / c.gpus_per_node);
}

int NodeOf(const ClusterSpec& c, int rank) { return rank / std::max(1, c.gpus_per_node); }

namespace {

double PerMatrixEfficiency(const std::vector<NsEfficiencyPoint>& t, int64_t min_dim) {
  if (t.empty()) return 1;
  if (min_dim <= t.front().min_dim) return t.front().efficiency;
  if (min_dim >= t.back().min_dim) return t.back().efficiency;
  size_t i = 1;
  while (t[i].min_dim < min_dim) ++i;
  const double x0 = std::log2(static_cast<double>(t[i - 1].min_dim));
  const double x1 = std::log2(static_cast<double>(t[i].min_dim));
  const double w = (std::log2(static_cast<double>(min_dim)) - x0) / (x1 - x0);
  return t[i - 1].efficiency + w * (t[i].efficiency - t[i - 1].efficiency);
}

}  // namespace

double NsEfficiency(const ClusterSpec& c, int64_t min_dim, int64_t matrices) {
  const double one = PerMatrixEfficiency(c.ns_efficiency, min_dim);
  const NsBatchPoint& b = c.ns_batched;
  if (matrices < 2 || b.matrices < 2 || c.ns_efficiency.empty()) return one;
  double best = 0;
  for (const NsEfficiencyPoint& p : c.ns_efficiency) best = std::max(best, p.efficiency);
  const double at_b = PerMatrixEfficiency(c.ns_efficiency, b.min_dim);
  if (best <= at_b || one >= best) return one;
  const double closed = std::clamp((b.efficiency - at_b) / (best - at_b), 0.0, 1.0);
  const double scale =
      std::min(1.0, std::log2(static_cast<double>(matrices)) / std::log2(static_cast<double>(b.matrices)));
  return one + closed * scale * (best - one);
}

}  // namespace muonshard::sim
