#include "worker/optimizer/internal/view_layout.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/model.h"
#include "plan/plan_stats.h"
#include "plan/tp_mesh.h"
#include "worker/optimizer/internal/ns_block_spec.h"
#include "worker/optimizer/internal/typed_buffer.h"
#include "worker/optimizer/optimizer_config.h"

namespace muonshard::worker::internal {
namespace {

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat("rank view: ", what)); }

// Elements of one held Muon matrix: the product of the last two dimensions.
int64_t MatrixNumel(const v1::PlannedTensor& t) {
  const auto& shape = planner::HeldShape(t);
  const int n = shape.size();
  return n >= 2 ? shape[n - 2] * shape[n - 1] : shape[n - 1];
}

class LayoutBuilder {
 public:
  explicit LayoutBuilder(const v1::RankView& view) : view_(view) {}

  absl::StatusOr<ViewLayout> Build() {
    MUONSHARD_RETURN_IF_ERROR(IndexGroups());
    MUONSHARD_RETURN_IF_ERROR(IndexTensors());
    MUONSHARD_RETURN_IF_ERROR(IndexMuonBuckets());
    MUONSHARD_RETURN_IF_ERROR(IndexAdamwBuckets());
    MUONSHARD_RETURN_IF_ERROR(CheckTiling());
    MUONSHARD_RETURN_IF_ERROR(IndexOwned());
    MUONSHARD_RETURN_IF_ERROR(CheckTotals());
    return std::move(layout_);
  }

 private:
  const v1::PlannedTensor& Tensor(const PartLayout& p) const { return view_.tensors(p.view_tensor).tensor(); }
  std::string Name(const PartLayout& p) const { return absl::StrCat("\"", Tensor(p).name(), "\""); }

  absl::Status IndexGroups() {
    layout_.rank = view_.rank().rank();
    if (layout_.rank < 0) return Invalid(absl::StrCat("rank ", layout_.rank, " is negative"));
    for (int pos = 0; pos < view_.groups_size(); ++pos) {
      const v1::CommGroup& g = view_.groups(pos);
      auto at = std::find(g.ranks().begin(), g.ranks().end(), layout_.rank);
      if (at == g.ranks().end()) {
        return Invalid(absl::StrCat("group ", g.id(), " does not hold rank ", layout_.rank));
      }
      GroupLayout gl;
      gl.view_group = pos;
      gl.id = g.id();
      gl.size = g.ranks_size();
      gl.group_rank = static_cast<int>(at - g.ranks().begin());
      layout_.groups.push_back(gl);
    }
    // One global order on every rank (ascending group id) keeps collectives
    // on groups that share ranks from deadlocking (NOTE [Collective ordering]).
    std::sort(layout_.groups.begin(), layout_.groups.end(),
              [](const GroupLayout& a, const GroupLayout& b) { return a.id < b.id; });
    for (int i = 0; i < static_cast<int>(layout_.groups.size()); ++i) {
      if (!group_of_id_.emplace(layout_.groups[i].id, i).second) {
        return Invalid(absl::StrCat("group ", layout_.groups[i].id, " appears twice"));
      }
    }
    return absl::OkStatus();
  }

  static absl::Status CheckTensor(const v1::PlannedTensor& t) {
    const std::string name = absl::StrCat("tensor \"", t.name(), "\": ");
    if (planner::DTypeSize(t.dtype()) == 0) return Invalid(absl::StrCat(name, "unknown dtype"));
    if (t.optimizer() != v1::MUON && t.optimizer() != v1::ADAMW) {
      return Invalid(absl::StrCat(name, "optimizer must be MUON or ADAMW"));
    }
    if (t.shape_size() == 0) return Invalid(absl::StrCat(name, "shape is empty"));
    if (t.optimizer() == v1::MUON && t.shape_size() != 2 && t.shape_size() != 3) {
      return Invalid(absl::StrCat(name, "a MUON tensor must be 2-D or 3-D"));
    }
    MUONSHARD_RETURN_IF_ERROR(CheckShape(name, "", t.shape(), t.numel()));
    if (t.local_shape_size() == 0) return absl::OkStatus();
    if (t.local_shape_size() != t.shape_size()) {
      return Invalid(
          absl::StrCat(name, "local_shape has ", t.local_shape_size(), " dimensions, shape ", t.shape_size()));
    }
    return CheckShape(name, "local_", t.local_shape(), t.local_numel());
  }

  static absl::Status CheckShape(absl::string_view name, absl::string_view prefix,
                                 const google::protobuf::RepeatedField<int64_t>& shape, int64_t want) {
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (d <= 0) return Invalid(absl::StrCat(name, prefix, "shape has a dimension <= 0"));
      numel *= d;
    }
    if (numel != want) {
      return Invalid(absl::StrCat(name, prefix, "numel ", want, " disagrees with the ", prefix, "shape (", numel, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status IndexTensors() {
    absl::flat_hash_map<int, int> seen;
    for (int i = 0; i < view_.tensors_size(); ++i) {
      const v1::IndexedTensor& it = view_.tensors(i);
      const v1::PlannedTensor& t = it.tensor();
      if (it.index() < 0 || !seen.emplace(it.index(), i).second) {
        return Invalid(absl::StrCat("tensor \"", t.name(), "\" has a negative or repeated index ", it.index()));
      }
      MUONSHARD_RETURN_IF_ERROR(CheckTensor(t));
      MUONSHARD_RETURN_IF_ERROR(AddHeldPart(it.index(), i));
    }
    std::sort(layout_.parts.begin(), layout_.parts.end(),
              [](const PartLayout& a, const PartLayout& b) { return a.tensor < b.tensor; });
    for (int i = 0; i < static_cast<int>(layout_.parts.size()); ++i) {
      layout_.part_of_tensor[layout_.parts[i].tensor] = i;
    }
    return absl::OkStatus();
  }

  // Records the part of tensor `index` that lives in one of the rank's groups.
  absl::Status AddHeldPart(int index, int view_tensor) {
    const v1::PlannedTensor& t = view_.tensors(view_tensor).tensor();
    bool held = false;
    for (const v1::TensorPart& p : t.parts()) {
      auto g = group_of_id_.find(p.group());
      if (g == group_of_id_.end()) continue;
      if (held) return Invalid(absl::StrCat("tensor \"", t.name(), "\" has two parts in the rank's groups"));
      if (p.element_begin() < 0 || p.element_begin() >= p.element_end() || p.element_end() > planner::HeldNumel(t)) {
        return Invalid(absl::StrCat("tensor \"", t.name(), "\": part [", p.element_begin(), ", ", p.element_end(),
                                    ") is empty or outside the tensor"));
      }
      held = true;
      PartLayout part;
      part.tensor = index;
      part.view_tensor = view_tensor;
      part.group = g->second;
      part.element_begin = p.element_begin();
      part.element_end = p.element_end();
      layout_.parts.push_back(std::move(part));
    }
    return absl::OkStatus();
  }

  // Checks one entry of a bucket of `group` (a layout position) and returns
  // the held part it belongs to. `end` is the end of the previous entry.
  absl::StatusOr<int> CheckEntry(const v1::BucketEntry& e, int group, v1::DType dtype, v1::Optimizer optimizer,
                                 absl::string_view what, int64_t* end) const {
    auto it = layout_.part_of_tensor.find(e.tensor());
    if (it == layout_.part_of_tensor.end()) {
      return Invalid(absl::StrCat(what, ": entry names tensor ", e.tensor(), ", which the rank does not hold"));
    }
    const PartLayout& part = layout_.parts[it->second];
    const v1::PlannedTensor& t = Tensor(part);
    if (part.group != group) return Invalid(absl::StrCat(what, ": ", Name(part), " is in another group"));
    if (t.optimizer() != optimizer) return Invalid(absl::StrCat(what, ": ", Name(part), " uses another optimizer"));
    if (t.dtype() != dtype) {
      return Invalid(absl::StrCat(what, ": ", Name(part), " is ", v1::DType_Name(t.dtype()), " in a ",
                                  v1::DType_Name(dtype), " bucket"));
    }
    if (e.numel() <= 0 || e.element_begin() < part.element_begin || e.element_begin() + e.numel() > part.element_end) {
      return Invalid(absl::StrCat(what, ": entry of ", Name(part), " is empty or outside the rank's part"));
    }
    if (e.offset() < *end || e.padded_numel() < e.numel()) {
      return Invalid(absl::StrCat(what, ": entry of ", Name(part), " overlaps the previous one"));
    }
    if (optimizer == v1::MUON && (e.element_begin() % MatrixNumel(t) != 0 || e.numel() % MatrixNumel(t) != 0)) {
      return Invalid(absl::StrCat(what, ": entry of ", Name(part), " does not hold whole matrices"));
    }
    *end = e.offset() + e.padded_numel();
    return it->second;
  }

  // The group (layout position) of a bucket and its common checks.
  absl::StatusOr<int> BucketGroup(int group_id, v1::DType dtype, int64_t numel, absl::string_view what) const {
    auto g = group_of_id_.find(group_id);
    if (g == group_of_id_.end()) {
      return Invalid(absl::StrCat(what, ": group ", group_id, " is not one of the rank's groups"));
    }
    if (planner::DTypeSize(dtype) == 0) return Invalid(absl::StrCat(what, ": unknown dtype"));
    if (numel < 0) return Invalid(absl::StrCat(what, ": negative size"));
    return g->second;
  }

  absl::Status IndexMuonBuckets() {
    for (int b = 0; b < view_.muon_buckets_size(); ++b) {
      const v1::MuonBucket& bucket = view_.muon_buckets(b);
      const std::string what = absl::StrCat("muon bucket ", bucket.id());
      MUONSHARD_ASSIGN_OR_RETURN(const int group, BucketGroup(bucket.group(), bucket.dtype(), bucket.numel(), what));
      const v1::CommGroup& g = view_.groups(layout_.groups[group].view_group);
      auto owner = std::find(g.ranks().begin(), g.ranks().end(), bucket.owner());
      if (owner == g.ranks().end()) {
        return Invalid(absl::StrCat(what, ": owner ", bucket.owner(), " is not in group ", g.id()));
      }
      if (!muon_bucket_of_id_.emplace(bucket.id(), b).second) return Invalid(absl::StrCat(what, ": repeated id"));
      int64_t end = 0;
      for (int k = 0; k < bucket.entries_size(); ++k) {
        MUONSHARD_ASSIGN_OR_RETURN(const int part,
                                   CheckEntry(bucket.entries(k), group, bucket.dtype(), v1::MUON, what, &end));
        layout_.parts[part].entries.push_back(EntryRef{true, b, k});
      }
      if (end > bucket.numel()) return Invalid(absl::StrCat(what, ": entries run past the buffer"));
      layout_.muon_buckets.push_back(
          MuonBucketLayout{group, static_cast<int>(owner - g.ranks().begin()), bucket.owner() == layout_.rank});
      layout_.groups[group].muon_buckets.push_back(b);
    }
    return absl::OkStatus();
  }

  static absl::Status CheckShardOffsets(const v1::AdamwBucket& bucket, int size, absl::string_view what) {
    if (bucket.shard_offsets_size() != size + 1 || bucket.shard_offsets(0) != 0 ||
        bucket.shard_offsets(size) != bucket.numel()) {
      return Invalid(
          absl::StrCat(what, ": shard_offsets must be ", size + 1, " boundaries from 0 to ", bucket.numel()));
    }
    for (int i = 0; i < size; ++i) {
      if (bucket.shard_offsets(i + 1) < bucket.shard_offsets(i)) {
        return Invalid(absl::StrCat(what, ": shard_offsets decrease at ", i + 1));
      }
    }
    return absl::OkStatus();
  }

  absl::Status IndexAdamwBuckets() {
    for (int b = 0; b < view_.adamw_buckets_size(); ++b) {
      const v1::AdamwBucket& bucket = view_.adamw_buckets(b);
      const std::string what = absl::StrCat("adamw bucket ", bucket.id());
      MUONSHARD_ASSIGN_OR_RETURN(const int group, BucketGroup(bucket.group(), bucket.dtype(), bucket.numel(), what));
      const GroupLayout& gl = layout_.groups[group];
      MUONSHARD_RETURN_IF_ERROR(CheckShardOffsets(bucket, gl.size, what));
      AdamwBucketLayout al;
      al.group = group;
      al.shard_begin = bucket.shard_offsets(gl.group_rank);
      al.shard_end = bucket.shard_offsets(gl.group_rank + 1);
      for (int i = 0; i < gl.size; ++i) {
        al.counts.push_back(bucket.shard_offsets(i + 1) - bucket.shard_offsets(i));
      }
      int64_t end = 0;
      for (int k = 0; k < bucket.entries_size(); ++k) {
        const v1::BucketEntry& e = bucket.entries(k);
        MUONSHARD_ASSIGN_OR_RETURN(const int part, CheckEntry(e, group, bucket.dtype(), v1::ADAMW, what, &end));
        layout_.parts[part].entries.push_back(EntryRef{false, b, k});
        const int64_t lo = std::max(e.offset(), al.shard_begin);
        const int64_t hi = std::min(e.offset() + e.padded_numel(), al.shard_end);
        if (lo < hi) al.segments.push_back(AdamwSegment{part, k, lo - al.shard_begin, hi - lo});
      }
      if (end > bucket.numel()) return Invalid(absl::StrCat(what, ": entries run past the buffer"));
      layout_.adamw_shard_numel += al.shard_end - al.shard_begin;
      state_bytes_ += (al.shard_end - al.shard_begin) * planner::AdamwStateBytesPerElem(bucket.dtype());
      layout_.adamw_buckets.push_back(std::move(al));
      layout_.groups[group].adamw_buckets.push_back(b);
    }
    return absl::OkStatus();
  }

  const v1::BucketEntry& Entry(const EntryRef& r) const {
    return r.muon ? view_.muon_buckets(r.bucket).entries(r.entry) : view_.adamw_buckets(r.bucket).entries(r.entry);
  }

  // The entries of every held part cover its element range exactly once, so
  // the buckets hold the rank's whole model copy.
  absl::Status CheckTiling() {
    for (PartLayout& part : layout_.parts) {
      std::sort(part.entries.begin(), part.entries.end(), [&](const EntryRef& a, const EntryRef& b) {
        return Entry(a).element_begin() < Entry(b).element_begin();
      });
      int64_t at = part.element_begin;
      for (const EntryRef& r : part.entries) {
        const v1::BucketEntry& e = Entry(r);
        if (e.element_begin() != at) {
          return Invalid(absl::StrCat("tensor ", Name(part), ": elements [", std::min(at, e.element_begin()), ", ",
                                      std::max(at, e.element_begin()), ") are ",
                                      e.element_begin() > at ? "in no bucket" : "in two buckets"));
        }
        at += e.numel();
      }
      if (at != part.element_end) {
        return Invalid(
            absl::StrCat("tensor ", Name(part), ": elements [", at, ", ", part.element_end, ") are in no bucket"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status IndexOwned() {
    std::vector<std::vector<bool>> claimed(view_.muon_buckets_size());
    for (int b = 0; b < view_.muon_buckets_size(); ++b) claimed[b].resize(view_.muon_buckets(b).entries_size());
    for (const v1::OwnedTensor& o : view_.rank().owned()) {
      const std::string what = absl::StrCat("owned tensor ", o.tensor(), " \"", o.name(), "\"");
      auto b = muon_bucket_of_id_.find(o.bucket());
      if (b == muon_bucket_of_id_.end()) {
        return Invalid(absl::StrCat(what, ": muon bucket ", o.bucket(), " is not in the view"));
      }
      if (!layout_.muon_buckets[b->second].owned) {
        return Invalid(absl::StrCat(what, ": muon bucket ", o.bucket(), " is owned by another rank"));
      }
      MUONSHARD_ASSIGN_OR_RETURN(const int entry, FindOwnedEntry(o, b->second, what));
      if (claimed[b->second][entry]) return Invalid(absl::StrCat(what, ": owned twice"));
      claimed[b->second][entry] = true;
      const v1::BucketEntry& e = view_.muon_buckets(b->second).entries(entry);
      const int part = layout_.part_of_tensor.at(e.tensor());
      const v1::PlannedTensor& t = Tensor(layout_.parts[part]);
      const auto& held = planner::HeldShape(t);
      const int n = held.size();
      MuonShardLayout shard;
      shard.part = part;
      shard.bucket = b->second;
      shard.entry = entry;
      shard.shape = kernels::MatrixBatchShape{o.matrix_end() - o.matrix_begin(), held[n - 2], held[n - 1]};
      shard.layout = KernelLayout(t.layout());
      MUONSHARD_ASSIGN_OR_RETURN(shard.tp, TpLayoutOf(o, t, shard.shape, what));
      MUONSHARD_RETURN_IF_ERROR(SetBlocks(t, what, shard));
      layout_.owned.push_back(std::move(shard));
      layout_.muon_state_numel += e.numel();
      state_bytes_ += e.numel() * planner::MuonStateBytesPerElem(t.dtype());
    }
    for (int b = 0; b < view_.muon_buckets_size(); ++b) {
      if (!layout_.muon_buckets[b].owned) continue;
      for (size_t k = 0; k < claimed[b].size(); ++k) {
        if (!claimed[b][k]) {
          return Invalid(absl::StrCat("muon bucket ", view_.muon_buckets(b).id(), " is owned by rank ", layout_.rank,
                                      " but entry ", k, " is not in its owned tensors"));
        }
      }
    }
    return absl::OkStatus();
  }

  // The TP op of an owned shard, checked against its tensor and the view's
  // TENSOR_PARALLEL group.
  absl::StatusOr<TpMuonLayout> TpLayoutOf(const v1::OwnedTensor& o, const v1::PlannedTensor& t,
                                          const kernels::MatrixBatchShape& shard, absl::string_view what) const {
    TpMuonLayout tp;
    tp.op = o.tp_op();
    if (tp.op == v1::TP_OP_NONE) {
      if (planner::IsTpSplit(t)) {
        return Invalid(absl::StrCat(what,
                                    ": a TP-split matrix without a TP op (Newton-Schulz on a shard alone "
                                    "is not Muon)"));
      }
      return tp;
    }
    if (tp.op != v1::TP_OP_GATHER_SCATTER && tp.op != v1::TP_OP_ALL_GATHER && tp.op != v1::TP_OP_LOCAL &&
        tp.op != v1::TP_OP_SHARDED_NS) {
      return Invalid(absl::StrCat(what, ": unknown tp_op ", tp.op));
    }
    if (tp.op == v1::TP_OP_SHARDED_NS) {
      const std::optional<planner::ShardedNs> ns = planner::ShardedNsOf(t);
      if (!ns.has_value()) {
        return Invalid(absl::StrCat(what, ": TP_OP_SHARDED_NS on a matrix not split along its long side alone"));
      }
      tp.sharded_rows = ns->rows;
    }
    if ((tp.op == v1::TP_OP_LOCAL) != t.ns_local() || (tp.op == v1::TP_OP_LOCAL && !t.has_ns_blocks())) {
      return Invalid(absl::StrCat(what, ": TP_OP_LOCAL goes with an ns_local tensor with ns_blocks, and only there"));
    }
    if (!planner::IsTpSplit(t)) return Invalid(absl::StrCat(what, ": tp_op on a tensor that is not TP-split"));
    auto g = group_of_id_.find(o.tp_group());
    const int tp_size = view_.topology().tp();
    if (g == group_of_id_.end() || view_.groups(layout_.groups[g->second].view_group).colour() != v1::TENSOR_PARALLEL ||
        layout_.groups[g->second].size != tp_size) {
      return Invalid(
          absl::StrCat(what, ": tp_group ", o.tp_group(), " is not the rank's TENSOR_PARALLEL group of ", tp_size));
    }
    tp.group = g->second;
    if (tp.op == v1::TP_OP_GATHER_SCATTER) {
      if (o.ns_tp_rank() < 0 || o.ns_tp_rank() >= tp_size) {
        return Invalid(absl::StrCat(what, ": ns_tp_rank ", o.ns_tp_rank(), " outside [0, ", tp_size, ")"));
      }
      tp.ns_rank = o.ns_tp_rank();
    }
    if (t.tp_mesh_split_size() > 0) return TpMeshLayoutOf(t, shard, what, tp);
    const int dim = planner::TpSplitDim(t.shape_size(), t.layout(), t.tp_split()) - (t.shape_size() - 2);
    if (dim < 0 || dim > 1) return Invalid(absl::StrCat(what, ": the TP split is not on a matrix dimension"));
    tp.dim = dim;
    tp.rows = dim == 0 ? shard.rows * tp_size : shard.rows;
    tp.cols = dim == 1 ? shard.cols * tp_size : shard.cols;
    const int64_t whole[2] = {tp.rows, tp.cols};
    for (int r = 0; r < tp_size; ++r) tp.all_runs.push_back(planner::TpShardRunsOf(whole, dim, tp_size, r));
    return tp;
  }

  // A matrix tiled over a tp mesh (NOTE [TP mesh tiles] in plan/tp_mesh.h):
  // every TP rank's tile of it, from the plan's one definition. Tiles of
  // ranks that replicate one are the same block (gathered twice, equal).
  absl::StatusOr<TpMuonLayout> TpMeshLayoutOf(const v1::PlannedTensor& t, const kernels::MatrixBatchShape& shard,
                                              absl::string_view what, TpMuonLayout tp) const {
    if (t.shape_size() != 2 || shard.batch != 1) {
      return Invalid(absl::StrCat(what, ": a tp mesh tile of a tensor that is not one 2-D matrix"));
    }
    const int tp_size = view_.topology().tp();
    tp.rows = t.shape(0);
    tp.cols = t.shape(1);
    for (int r = 0; r < tp_size; ++r) {
      const planner::TpTile tile = planner::TpTileOf(t, view_.topology(), r);
      if (tile.shape[0] != shard.rows || tile.shape[1] != shard.cols) {
        return Invalid(absl::StrCat(what, ": tp rank ", r, "'s tile is not the shard's shape"));
      }
      tp.all_runs.push_back(planner::RunsOfTile(t.shape(), tile));
    }
    return tp;
  }

  // The blocks Newton-Schulz runs on (MuonShardLayout::blocks): the whole
  // matrix's for an owner-whole matrix and the TP gather, the rank's own
  // shard's for TP_OP_LOCAL (shard t holds [t L/tp, (t+1) L/tp) of the
  // blocked axis, which must be the split one).
  absl::Status SetBlocks(const v1::PlannedTensor& t, absl::string_view what, MuonShardLayout& shard) const {
    if (!t.has_ns_blocks()) return absl::OkStatus();
    const bool split = shard.tp.op != v1::TP_OP_NONE;
    const int64_t rows = split ? shard.tp.rows : shard.shape.rows;
    const int64_t cols = split ? shard.tp.cols : shard.shape.cols;
    absl::StatusOr<kernels::NsBlockSpec> whole = NsBlockSpecOf(t.ns_blocks(), rows, cols);
    if (whole.ok()) whole = CheckedSpec(*std::move(whole), {shard.shape.batch, rows, cols});
    if (!whole.ok()) return Invalid(absl::StrCat(what, ": ", whole.status().message()));
    shard.blocked = true;
    if (shard.tp.op != v1::TP_OP_LOCAL) {
      shard.blocks = *std::move(whole);
      return absl::OkStatus();
    }
    const int blocked_dim = whole->axis == kernels::NsBlockAxis::kRows ? 0 : 1;
    if (shard.tp.dim != blocked_dim) {
      return Invalid(absl::StrCat(what, ": TP_OP_LOCAL but the TP split is not along the blocked axis"));
    }
    const int64_t length = blocked_dim == 0 ? shard.shape.rows : shard.shape.cols;
    const int64_t begin = view_.rank().tp_rank() * length;
    absl::StatusOr<kernels::NsBlockSpec> local = ShardNsBlockSpec(*whole, begin, begin + length);
    if (local.ok()) local = CheckedSpec(*std::move(local), shard.shape);
    if (!local.ok()) return Invalid(absl::StrCat(what, ": TP_OP_LOCAL: ", local.status().message()));
    shard.blocks = *std::move(local);
    return absl::OkStatus();
  }

  static absl::StatusOr<kernels::NsBlockSpec> CheckedSpec(kernels::NsBlockSpec spec,
                                                          const kernels::MatrixBatchShape& shape) {
    absl::Status s = kernels::ValidateNsBlockSpec(spec, shape);
    if (!s.ok()) return s;
    return spec;
  }

  absl::StatusOr<int> FindOwnedEntry(const v1::OwnedTensor& o, int bucket, absl::string_view what) const {
    const v1::MuonBucket& b = view_.muon_buckets(bucket);
    for (int k = 0; k < b.entries_size(); ++k) {
      const v1::BucketEntry& e = b.entries(k);
      if (e.tensor() != o.tensor()) continue;
      const int64_t matrix = MatrixNumel(Tensor(layout_.parts[layout_.part_of_tensor.at(e.tensor())]));
      if (e.element_begin() == o.matrix_begin() * matrix && e.numel() == o.numel() &&
          (o.matrix_end() - o.matrix_begin()) * matrix == o.numel()) {
        return k;
      }
    }
    return Invalid(absl::StrCat(what, ": matrices [", o.matrix_begin(), ", ", o.matrix_end(),
                                ") match no entry of muon bucket ", o.bucket()));
  }

  absl::Status CheckTotals() const {
    const v1::RankPlan& r = view_.rank();
    if (layout_.muon_state_numel != r.muon_numel()) {
      return Invalid(absl::StrCat("rank ", r.rank(), ": muon_numel is ", r.muon_numel(), " but its owned tensors hold ",
                                  layout_.muon_state_numel));
    }
    if (layout_.adamw_shard_numel != r.adamw_shard_numel()) {
      return Invalid(absl::StrCat("rank ", r.rank(), ": adamw_shard_numel is ", r.adamw_shard_numel(),
                                  " but its bucket shards hold ", layout_.adamw_shard_numel));
    }
    // As the planner counts them (plan_stats.h): masters only for BF16/FP16.
    if (state_bytes_ != r.optimizer_state_bytes()) {
      return Invalid(absl::StrCat("rank ", r.rank(), ": optimizer_state_bytes is ", r.optimizer_state_bytes(),
                                  " but the layout needs ", state_bytes_));
    }
    return absl::OkStatus();
  }

  const v1::RankView& view_;
  ViewLayout layout_;
  absl::flat_hash_map<int, int> group_of_id_;        // plan group id -> layout_.groups position
  absl::flat_hash_map<int, int> muon_bucket_of_id_;  // bucket id -> view position
  int64_t state_bytes_ = 0;                          // the optimizer state the layout needs
};

}  // namespace

absl::StatusOr<ViewLayout> BuildViewLayout(const v1::RankView& view) { return LayoutBuilder(view).Build(); }

}  // namespace muonshard::worker::internal
