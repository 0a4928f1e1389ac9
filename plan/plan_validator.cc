#include "plan/plan_validator.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/bucketing.h"
#include "plan/canonical.h"
#include "plan/memory.h"
#include "plan/model.h"
#include "plan/ns_blocks.h"
#include "plan/plan_stats.h"
#include "plan/tp_mesh.h"

namespace muonshard::planner {
namespace {

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("invalid plan: ", what));
}

bool InGroup(const v1::CommGroup& g, int rank) {
  return std::find(g.ranks().begin(), g.ranks().end(), rank) != g.ranks().end();
}

absl::Status CheckGroups(const v1::Plan& plan) {
  const int w = plan.topology().world_size();
  if (plan.ranks_size() != w) {
    return Invalid(absl::StrCat("has ", plan.ranks_size(), " ranks, topology says ", w));
  }
  for (int i = 0; i < plan.groups_size(); ++i) {
    const v1::CommGroup& g = plan.groups(i);
    if (g.id() != i) return Invalid(absl::StrCat("group #", i, " has id ", g.id()));
    if (g.ranks_size() == 0) return Invalid(absl::StrCat("group ", i, " is empty"));
    for (int r : g.ranks()) {
      if (r < 0 || r >= w) return Invalid(absl::StrCat("group ", i, " holds rank ", r, " outside the world"));
    }
  }
  for (int i = 0; i < plan.ranks_size(); ++i) {
    if (plan.ranks(i).rank() != i) return Invalid(absl::StrCat("ranks[", i, "] has rank ", plan.ranks(i).rank()));
  }
  return absl::OkStatus();
}

// Per-block Newton-Schulz: blocks only on Muon matrices, tiling them, and
// ns_local exactly where they align with the tensor's TP split (the worker
// then orthogonalises shards without a gather).
absl::Status CheckTensorBlocks(const v1::Plan& plan) {
  const int tp = std::max(1, plan.topology().tp());
  for (int i = 0; i < plan.tensors_size(); ++i) {
    const v1::PlannedTensor& t = plan.tensors(i);
    const std::string what = absl::StrCat("tensor ", i, " \"", t.name(), "\"");
    if (!t.has_ns_blocks()) {
      if (t.ns_local()) return Invalid(absl::StrCat(what, " is ns_local without ns_blocks"));
      continue;
    }
    if (t.optimizer() != v1::MUON) return Invalid(absl::StrCat(what, " has ns_blocks but is not a Muon tensor"));
    absl::Status s = CheckNsBlocks(t.ns_blocks(), t.shape());
    if (!s.ok()) return Invalid(absl::StrCat(what, ": ", s.message()));
    const bool aligned = IsTpSplit(t) && NsBlocksAlignWithTp(t.ns_blocks(), t.shape(),
                                                             TpSplitDim(t.shape_size(), t.layout(), t.tp_split()), tp);
    if (t.ns_local() != aligned) {
      return Invalid(absl::StrCat(what, t.ns_local() ? " is ns_local but its blocks do not align with its TP split"
                                                     : " has blocks aligned with its TP split but is not ns_local"));
    }
  }
  return absl::OkStatus();
}

// Tensors tiled over a tp mesh (NOTE [TP mesh tiles] in tp_mesh.h): only on
// a plan whose topology has the mesh, one split per mesh dimension, even
// tiles of tile 0's local shape, no per-block Newton-Schulz.
absl::Status CheckTpMeshTiles(const v1::Plan& plan) {
  const std::vector<int> mesh = TpMeshOf(plan.topology());
  for (int i = 0; i < plan.tensors_size(); ++i) {
    const v1::PlannedTensor& t = plan.tensors(i);
    if (t.tp_mesh_split_size() == 0) continue;
    const std::string what = absl::StrCat("tensor ", i, " \"", t.name(), "\"");
    const std::vector<v1::TpSplit> splits = MeshSplitOf(t.tp_mesh_split(), t.tp_split());
    absl::Status s = CheckTpTiles(t.shape(), t.layout(), mesh, splits);
    if (!s.ok()) return Invalid(absl::StrCat(what, ": tp_mesh_split: ", s.message()));
    if (t.tp_split() != v1::TP_SPLIT_UNSPECIFIED || t.has_ns_blocks() || !IsTpSplit(t)) {
      return Invalid(absl::StrCat(what, ": a tp_mesh_split tensor has no tp_split or ns_blocks and a local_shape"));
    }
    const TpTile tile = TpTileOf(t, plan.topology(), 0);
    if (!std::equal(tile.shape.begin(), tile.shape.end(), t.local_shape().begin(), t.local_shape().end())) {
      return Invalid(absl::StrCat(what, ": local_shape is not its tp mesh tile's shape"));
    }
  }
  return absl::OkStatus();
}

// The elements a rank holds of tensor t: its TP shard, or all of it.
int64_t HeldNumel(const v1::PlannedTensor& t) { return t.local_numel() > 0 ? t.local_numel() : t.numel(); }

// Whether [begin, end) of tensor t lies in a part that lives in `group`.
bool InPartOf(const v1::PlannedTensor& t, int group, int64_t begin, int64_t end) {
  for (const v1::TensorPart& p : t.parts()) {
    if (p.group() == group && p.element_begin() <= begin && end <= p.element_end()) return true;
  }
  return false;
}

// Entries lie inside a part of their tensor in the bucket's group, in offset
// order, without overlap, inside the buffer.
absl::Status CheckEntries(const v1::Plan& plan, const google::protobuf::RepeatedPtrField<v1::BucketEntry>& entries,
                          int group, int64_t numel, absl::string_view what) {
  int64_t end = 0;
  for (const v1::BucketEntry& e : entries) {
    if (e.tensor() < 0 || e.tensor() >= plan.tensors_size()) {
      return Invalid(absl::StrCat(what, ": entry names tensor ", e.tensor()));
    }
    const v1::PlannedTensor& t = plan.tensors(e.tensor());
    if (e.element_begin() < 0 || e.numel() <= 0 || e.element_begin() + e.numel() > HeldNumel(t)) {
      return Invalid(absl::StrCat(what, ": entry of \"", t.name(), "\" is outside the tensor"));
    }
    if (!InPartOf(t, group, e.element_begin(), e.element_begin() + e.numel())) {
      return Invalid(absl::StrCat(what, ": entry of \"", t.name(), "\" is not in a part of the bucket's group"));
    }
    if (e.offset() < end || e.padded_numel() < e.numel()) {
      return Invalid(absl::StrCat(what, ": entry of \"", t.name(), "\" overlaps the previous one"));
    }
    if ((e.offset() * DTypeSize(t.dtype())) % kAlignBytes != 0) {
      return Invalid(absl::StrCat(what, ": entry of \"", t.name(), "\" is not 256-byte aligned"));
    }
    end = e.offset() + e.padded_numel();
  }
  if (end > numel) return Invalid(absl::StrCat(what, ": entries run past the buffer"));
  return absl::OkStatus();
}

// Per tensor and tp rank (tensor * tp + t): the (begin, end) element
// intervals assigned so far. Each tp rank's groups hold their own copy or
// shard of every dense tensor; an expert tensor is held once.
class Coverage {
 public:
  explicit Coverage(const v1::Plan& plan)
      : tp_(std::max(1, plan.topology().tp())), intervals_(plan.tensors_size() * tp_) {}

  void Add(const v1::Plan& plan, int group, int tensor, int64_t begin, int64_t end) {
    const int t = tp_ > 1 ? plan.groups(group).tp_rank() : 0;
    intervals_[tensor * tp_ + std::clamp(t, 0, tp_ - 1)].emplace_back(begin, end);
  }

  absl::Status Check(const v1::Plan& plan, v1::Optimizer which) {
    for (int i = 0; i < plan.tensors_size(); ++i) {
      const v1::PlannedTensor& t = plan.tensors(i);
      if (t.optimizer() != which) continue;
      if (t.colour() == v1::MOE_EXPERT) {
        // Experts are never TP-split: each lives in one moe_sharding group,
        // whichever tp rank's that is (ep rank = d * tp + t).
        std::vector<std::pair<int64_t, int64_t>> all;
        for (int r = 0; r < tp_; ++r)
          all.insert(all.end(), intervals_[i * tp_ + r].begin(), intervals_[i * tp_ + r].end());
        MUONSHARD_RETURN_IF_ERROR(CheckOne(t, -1, all));
        continue;
      }
      for (int r = 0; r < tp_; ++r) {
        MUONSHARD_RETURN_IF_ERROR(CheckOne(t, r, intervals_[i * tp_ + r]));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status CheckOne(const v1::PlannedTensor& t, int tp_rank, std::vector<std::pair<int64_t, int64_t>>& v) {
    const std::string of = tp_rank >= 0 && tp_ > 1 ? absl::StrCat(" on tp rank ", tp_rank) : "";
    std::sort(v.begin(), v.end());
    int64_t at = 0;
    for (auto [b, e] : v) {
      if (b != at) {
        return Invalid(absl::StrCat("tensor \"", t.name(), "\": elements [", std::min(b, at), ", ", std::max(b, at),
                                    ") are ", b > at ? "not owned" : "owned twice", of));
      }
      at = e;
    }
    if (at != HeldNumel(t)) {
      return Invalid(absl::StrCat("tensor \"", t.name(), "\": owned up to element ", at, " of ", HeldNumel(t), of));
    }
    return absl::OkStatus();
  }

  int tp_;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> intervals_;
};

bool BucketHolds(const v1::MuonBucket& bucket, int tensor) {
  for (const v1::BucketEntry& e : bucket.entries()) {
    if (e.tensor() == tensor) return true;
  }
  return false;
}

// Tensor parallelism: the shards of every split Muon matrix are owned by the
// tp ranks of one replica (a TENSOR_PARALLEL group holding the owner), which
// agree on the op and on the tp rank that runs Newton-Schulz.
absl::Status CheckTpOps(const v1::Plan& plan) {
  struct Pair {
    int tp_group = -1;
    int ns_tp_rank = -1;
    v1::TpMuonOp op = v1::TP_OP_NONE;
    int owners = 0;
  };
  absl::flat_hash_map<std::pair<int, int>, Pair> pairs;  // (tensor, first matrix)
  const int tp = std::max(1, plan.topology().tp());
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      const bool split = plan.tensors(o.tensor()).local_numel() > 0;
      const std::string what = absl::StrCat("rank ", r.rank(), " owns tensor ", o.tensor());
      if (split != (o.tp_op() != v1::TP_OP_NONE)) return Invalid(absl::StrCat(what, " with the wrong TP op"));
      if (!split) continue;
      if (plan.tensors(o.tensor()).ns_local() != (o.tp_op() == v1::TP_OP_LOCAL)) {
        return Invalid(absl::StrCat(what, ": TP_OP_LOCAL goes with an ns_local tensor and only there"));
      }
      if (o.tp_group() < 0 || o.tp_group() >= plan.groups_size() ||
          plan.groups(o.tp_group()).colour() != v1::TENSOR_PARALLEL || !InGroup(plan.groups(o.tp_group()), r.rank())) {
        return Invalid(absl::StrCat(what, " through TP group ", o.tp_group(), ", which is not its own"));
      }
      if (o.tp_op() == v1::TP_OP_SHARDED_NS &&
          (plan.policy().tp_muon() != v1::TP_MUON_SHARDED || !ShardedNsOf(plan.tensors(o.tensor())).has_value())) {
        return Invalid(absl::StrCat(what,
                                    ": TP_OP_SHARDED_NS needs TP_MUON_SHARDED and a matrix split along its "
                                    "long side alone"));
      }
      if (o.tp_op() == v1::TP_OP_GATHER_SCATTER && (o.ns_tp_rank() < 0 || o.ns_tp_rank() >= tp)) {
        return Invalid(absl::StrCat(what, ": Newton-Schulz on tp rank ", o.ns_tp_rank()));
      }
      Pair& p = pairs[{o.tensor(), o.matrix_begin()}];
      if (p.owners > 0 && (p.tp_group != o.tp_group() || p.ns_tp_rank != o.ns_tp_rank() || p.op != o.tp_op())) {
        return Invalid(absl::StrCat(what, ": its shards' owners are not one replica's tp ranks agreeing on the op"));
      }
      p = Pair{o.tp_group(), o.ns_tp_rank(), o.tp_op(), p.owners + 1};
    }
  }
  for (const auto& [key, p] : pairs) {
    if (p.owners != tp) {
      return Invalid(
          absl::StrCat("tensor ", key.first, ": ", p.owners, " shard owners of matrix ", key.second, ", tp is ", tp));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMuon(const v1::Plan& plan) {
  Coverage cover(plan);
  for (const v1::MuonBucket& b : plan.muon_buckets()) {
    std::string what = absl::StrCat("muon bucket ", b.id());
    if (b.group() < 0 || b.group() >= plan.groups_size()) return Invalid(absl::StrCat(what, ": bad group"));
    if (!InGroup(plan.groups(b.group()), b.owner())) return Invalid(absl::StrCat(what, ": owner not in group"));
    MUONSHARD_RETURN_IF_ERROR(CheckEntries(plan, b.entries(), b.group(), b.numel(), what));
    for (const v1::BucketEntry& e : b.entries()) {
      const v1::PlannedTensor& t = plan.tensors(e.tensor());
      if (t.optimizer() != v1::MUON || t.dtype() != b.dtype()) {
        return Invalid(absl::StrCat(what, ": holds \"", t.name(), "\" of another optimizer or dtype"));
      }
      cover.Add(plan, b.group(), e.tensor(), e.element_begin(), e.element_begin() + e.numel());
    }
  }
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      if (o.bucket() < 0 || o.bucket() >= plan.muon_buckets_size() ||
          plan.muon_buckets(o.bucket()).owner() != r.rank()) {
        return Invalid(absl::StrCat("rank ", r.rank(), " owns \"", o.name(), "\" through a bucket it does not own"));
      }
      // Views and display names index plan.tensors by it (fuzz finding 1,
      // docs/hardening.md).
      if (!BucketHolds(plan.muon_buckets(o.bucket()), o.tensor())) {
        return Invalid(absl::StrCat("rank ", r.rank(), " owns tensor ", o.tensor(), ", which its bucket ", o.bucket(),
                                    " does not hold"));
      }
    }
  }
  MUONSHARD_RETURN_IF_ERROR(CheckTpOps(plan));
  return cover.Check(plan, v1::MUON);
}

absl::Status CheckAdamw(const v1::Plan& plan) {
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    std::string what = absl::StrCat("adamw bucket ", b.id());
    if (b.group() < 0 || b.group() >= plan.groups_size()) return Invalid(absl::StrCat(what, ": bad group"));
    MUONSHARD_RETURN_IF_ERROR(CheckEntries(plan, b.entries(), b.group(), b.numel(), what));
    const int n = plan.groups(b.group()).ranks_size();
    if (b.shard_offsets_size() != n + 1 || b.shard_offsets(0) != 0 || b.shard_offsets(n) != b.numel()) {
      return Invalid(absl::StrCat(what, ": shard offsets do not cover the buffer"));
    }
    for (int i = 0; i < n; ++i) {
      if (b.shard_offsets(i + 1) < b.shard_offsets(i) ||
          (b.shard_offsets(i) * DTypeSize(b.dtype())) % kAlignBytes != 0) {
        return Invalid(absl::StrCat(what, ": shard ", i, " is not an aligned, ordered range"));
      }
    }
  }
  Coverage cover(plan);
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::TensorSlice& s : r.slices()) {
      if (s.tensor() < 0 || s.tensor() >= plan.tensors_size() || s.begin() >= s.end() || s.bucket() < 0 ||
          s.bucket() >= plan.adamw_buckets_size()) {
        return Invalid(absl::StrCat("rank ", r.rank(), ": empty or unknown slice of \"", s.name(), "\""));
      }
      cover.Add(plan, plan.adamw_buckets(s.bucket()).group(), s.tensor(), s.begin(), s.end());
    }
  }
  return cover.Check(plan, v1::ADAMW);
}

bool SameMemory(const v1::RankMemory& a, const v1::RankMemory& b) {
  for (const MemoryTerm& term : MemoryTerms()) {
    if ((a.*term.get)() != (b.*term.get)()) return false;
  }
  return a.total_bytes() == b.total_bytes() && a.capacity_bytes() == b.capacity_bytes() &&
         a.headroom_bytes() == b.headroom_bytes();
}

// Plans stored before RankPlan.memory existed carry none; a plan that
// carries it must carry what its buckets and tensors imply.
absl::Status CheckMemory(const v1::Plan& plan) {
  MUONSHARD_RETURN_IF_ERROR(CanonicalCapacities(plan.topology(), plan.ranks_size()).status());
  std::vector<v1::RankMemory> memory;
  for (const v1::RankPlan& r : plan.ranks()) {
    if (!r.has_memory()) continue;
    if (memory.empty()) memory = ComputeRankMemory(plan);
    if (!SameMemory(r.memory(), memory[r.rank()])) {
      return Invalid(absl::StrCat("rank ", r.rank(), ": memory disagrees with its buckets and owned tensors"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTotals(const v1::Plan& plan) {
  std::vector<RankTotals> totals = ComputeRankTotals(plan);
  for (const v1::RankPlan& r : plan.ranks()) {
    const RankTotals& t = totals[r.rank()];
    if (t.optimizer_state_bytes != r.optimizer_state_bytes() || t.muon_numel != r.muon_numel() ||
        t.adamw_numel != r.adamw_numel() || t.adamw_shard_numel != r.adamw_shard_numel()) {
      return Invalid(absl::StrCat("rank ", r.rank(), ": totals disagree with its owned tensors and slices"));
    }
  }
  return CheckMemory(plan);
}

}  // namespace

absl::Status ValidatePlan(const v1::Plan& plan) {
  MUONSHARD_RETURN_IF_ERROR(CheckGroups(plan));
  MUONSHARD_RETURN_IF_ERROR(CheckTensorBlocks(plan));
  MUONSHARD_RETURN_IF_ERROR(CheckTpMeshTiles(plan));
  MUONSHARD_RETURN_IF_ERROR(CheckMuon(plan));
  MUONSHARD_RETURN_IF_ERROR(CheckAdamw(plan));
  return CheckTotals(plan);
}

}  // namespace muonshard::planner
