#include "plan/tensor_parallel.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "plan/ns_blocks.h"
#include "plan/plan_stats.h"
#include "plan/tp_mesh.h"
#include "plan/tp_rounds.h"

namespace muonshard::planner {
namespace {

bool IsSplit(v1::TpSplit s) { return s == v1::TP_COLUMN || s == v1::TP_ROW; }

// Whether the spec is split over the tp ranks: by tp_split, or by a tp mesh
// dimension (NOTE [TP mesh tiles] in tp_mesh.h).
bool IsSplitSpec(const v1::TensorSpec& spec) {
  return AnyMeshSplit(MeshSplitOf(spec.tp_mesh_split(), spec.tp_split()));
}

int64_t Product(const google::protobuf::RepeatedField<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

// Where each manifest tensor comes from: which part's plan, and its index
// there.
struct Source {
  const v1::Plan* plan = nullptr;
  int index = -1;
  bool dense = true;
};

std::vector<Source> SourcesOf(const TpParts& parts, int num_tensors) {
  std::vector<Source> sources(num_tensors);
  for (int k = 0; k < static_cast<int>(parts.dense_index.size()); ++k) {
    sources[parts.dense_index[k]] = {parts.dense, k, true};
  }
  for (int k = 0; k < static_cast<int>(parts.expert_index.size()); ++k) {
    sources[parts.expert_index[k]] = {parts.experts, k, false};
  }
  return sources;
}

// The group of the whole layout: a replica group g (DEFAULT p) is (p, t);
// an expert plan's MOE_EXPERT group (p, e) is pp + p * ep + e there and
// pp * tp + p * ep + e here.
int DenseGroup(int g, int tp, int t) { return g * tp + t; }
int ExpertGroup(int g, const RankLayout& layout) { return g + layout.pp() * (layout.tp() - 1); }

// Whole shapes and the TP fields of every tensor; dense parts once per tp
// rank, expert parts in their moe_sharding groups.
void ExpandTensors(const std::vector<Source>& sources, const v1::ModelManifest& manifest, const RankLayout& layout,
                   v1::Plan* out) {
  const int tp = layout.tp();
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    const v1::TensorSpec& spec = manifest.tensors(i);
    v1::PlannedTensor* t = out->add_tensors();
    if (sources[i].plan == nullptr) {  // an expert tensor of the dense part's plan
      t->set_name(spec.name());
      continue;
    }
    const v1::PlannedTensor& from = sources[i].plan->tensors(sources[i].index);
    *t = from;
    t->clear_parts();
    *t->mutable_shape() = spec.shape();
    t->set_numel(Product(spec.shape()));
    if (IsSplitSpec(spec)) {
      t->set_tp_split(spec.tp_split());
      *t->mutable_tp_mesh_split() = spec.tp_mesh_split();
      *t->mutable_local_shape() = from.shape();
      t->set_local_numel(from.numel());
    }
    if (spec.has_ns_blocks()) {  // the replica's shard had none: they describe the whole tensor
      *t->mutable_ns_blocks() = spec.ns_blocks();
      t->set_ns_local(IsSplit(spec.tp_split()) &&
                      NsBlocksAlignWithTp(spec.ns_blocks(), spec.shape(),
                                          TpSplitDim(spec.shape_size(), spec.layout(), spec.tp_split()), tp));
    }
    for (const v1::TensorPart& part : from.parts()) {
      for (int r = 0; r < (sources[i].dense ? tp : 1); ++r) {
        v1::TensorPart* p = t->add_parts();
        *p = part;
        p->set_group(sources[i].dense ? DenseGroup(part.group(), tp, r) : ExpertGroup(part.group(), layout));
      }
    }
  }
}

// Manifest tensor index of each part's tensor index.
template <typename Message>
void RemapTensor(const std::vector<int>& index, Message& m) {
  m.set_tensor(index[m.tensor()]);
}

template <typename Bucket>
void RemapEntries(const std::vector<int>& index, Bucket& b) {
  for (v1::BucketEntry& e : *b.mutable_entries()) RemapTensor(index, e);
}

// The replica's buckets once per tp rank (id b * tp + t), then the expert
// plan's (ids after them, groups renumbered).
template <typename Bucket>
void ExpandBuckets(const google::protobuf::RepeatedPtrField<Bucket>& dense,
                   const google::protobuf::RepeatedPtrField<Bucket>* experts, const TpParts& parts,
                   const RankLayout& layout, google::protobuf::RepeatedPtrField<Bucket>* out) {
  const int tp = layout.tp();
  for (const Bucket& b : dense) {
    for (int r = 0; r < tp; ++r) {
      Bucket* e = out->Add();
      *e = b;
      e->set_id(b.id() * tp + r);
      e->set_group(DenseGroup(b.group(), tp, r));
      if constexpr (std::is_same_v<Bucket, v1::MuonBucket>) e->set_owner(b.owner() * tp + r);
      RemapEntries(parts.dense_index, *e);
    }
  }
  if (experts == nullptr) return;
  const int base = dense.size() * tp;
  for (const Bucket& b : *experts) {
    Bucket* e = out->Add();
    *e = b;
    e->set_id(base + b.id());
    e->set_group(ExpertGroup(b.group(), layout));
    RemapEntries(parts.expert_index, *e);
  }
}

// The most buckets PlanNsRounds puts in one round, per tp rank: enough to
// balance a round, few enough for the next round's reduce to overlap it.
constexpr int kMaxRoundBuckets = 4;

// The hand-off place of each of the replica's Muon buckets, by id: its
// largest tensor index in the whole model, and its position (NOTE [TP
// exchange rounds]).
using HandOff = absl::flat_hash_map<int, std::pair<int, int>>;

HandOff HandOffOf(const v1::Plan& dense, const std::vector<int>& dense_index) {
  HandOff hand_off;
  for (int b = 0; b < dense.muon_buckets_size(); ++b) {
    int last = -1;
    for (const v1::BucketEntry& e : dense.muon_buckets(b).entries()) last = std::max(last, dense_index[e.tensor()]);
    hand_off[dense.muon_buckets(b).id()] = {last, b};
  }
  return hand_off;
}

// Replica rank `owner`'s TP-exchanged buckets in hand-off order, for
// PlanNsRounds: a gathered matrix's id is its position in owned().
std::vector<NsRoundBucket> ExchangedBuckets(const v1::RankPlan& owner, const v1::Plan& out, const HandOff& hand_off) {
  const v1::TpMuonMode mode = out.policy().tp_muon();
  absl::flat_hash_map<int, NsRoundBucket> by_id;
  for (int k = 0; k < owner.owned_size(); ++k) {
    const v1::OwnedTensor& o = owner.owned(k);
    const v1::PlannedTensor& t = out.tensors(o.tensor());
    if (!IsTpSplit(t) || t.ns_local()) continue;
    NsRoundBucket& b = by_id[o.bucket()];
    const std::optional<ShardedNs> sharded = mode == v1::TP_MUON_SHARDED ? ShardedNsOf(t) : std::nullopt;
    if (sharded.has_value()) {
      b.covers_all = true;
      b.every_rank += (o.matrix_end() - o.matrix_begin()) * sharded->Flops(out.policy().ns_steps());
    } else if (mode == v1::TP_MUON_DUPLICATED) {
      b.covers_all = true;
      b.every_rank += o.ns_flops();
    } else {
      b.gathered.emplace_back(k, o.ns_flops());
    }
  }
  std::vector<std::pair<std::pair<int, int>, NsRoundBucket*>> order;
  for (auto& [id, b] : by_id) {
    const std::pair<int, int>& place = hand_off.at(id);
    order.push_back({{-place.first, place.second}, &b});  // last tensor descending, then position
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<NsRoundBucket> buckets;
  buckets.reserve(order.size());
  for (auto& [place, b] : order) buckets.push_back(std::move(*b));
  return buckets;
}

// Each of `round`'s bins, largest first, onto the tp rank (one per bin)
// least loaded over the step so far, ties to the one whose moe_sharding
// group is least loaded over the replicas so far (`across`, per ep rank;
// per tp rank with ep = 1, `key` of each tp rank): with ep > 1 a group's
// experts can level its ranks' dense load only if every group carries its
// share.
void PlaceRound(const NsRound& round, const v1::RankPlan& owner, const std::vector<int>& key, std::vector<double>& load,
                std::vector<double>& across, std::vector<int>& ns_rank) {
  std::vector<std::pair<double, int>> bins;  // (-FLOPs, bin): largest first
  for (int b = 0; b < static_cast<int>(round.bins.size()); ++b) {
    double flops = 0;
    for (int k : round.bins[b]) flops += owner.owned(k).ns_flops();
    bins.emplace_back(-flops, b);
  }
  std::sort(bins.begin(), bins.end());
  std::vector<bool> used(load.size(), false);
  for (const auto& [minus_flops, b] : bins) {
    int t = -1;
    for (int u = 0; u < static_cast<int>(load.size()); ++u) {
      if (!used[u] && (t < 0 || std::tie(load[u], across[key[u]]) < std::tie(load[t], across[key[t]]))) t = u;
    }
    used[t] = true;
    load[t] -= minus_flops;
    across[key[t]] -= minus_flops;
    for (int k : round.bins[b]) ns_rank[k] = t;
  }
}

// The tp rank that orthogonalises each of `owned` (-1 for replicated,
// local and sharded matrices; any rank for all-gathered ones), round by
// round (NOTE [TP exchange rounds], PlaceRound). Independent of the
// experts, so the dense part's load per rank is known before they are
// planned.
std::vector<int> AssignNsRanks(const v1::RankPlan& owner, const v1::Plan& out, const RankLayout& layout,
                               const HandOff& hand_off, std::vector<double>& across) {
  const int tp = layout.tp();
  std::vector<int> ns_rank(owner.owned_size(), -1);
  if (out.policy().tp_muon() == v1::TP_MUON_DUPLICATED) {
    for (int k = 0; k < owner.owned_size(); ++k) {
      const v1::PlannedTensor& t = out.tensors(owner.owned(k).tensor());
      if (IsTpSplit(t) && !t.ns_local()) ns_rank[k] = 0;  // every tp rank runs it
    }
    return ns_rank;
  }
  // The `across` entry of each tp rank: its ep rank's (its moe_sharding
  // group's), or the tp rank itself with ep = 1.
  std::vector<int> key(tp);
  for (int t = 0; t < tp; ++t) key[t] = (owner.rank() * tp + t) % layout.block();
  std::vector<double> load(tp, 0);
  for (const NsRound& round : PlanNsRounds(ExchangedBuckets(owner, out, hand_off), tp, kMaxRoundBuckets * tp)) {
    PlaceRound(round, owner, key, load, across, ns_rank);
  }
  return ns_rank;
}

// Rank `q * tp + t`'s copy of replica rank q's owned matrix.
void SetTpOp(v1::TpMuonMode mode, int tp, int t, int ns_rank, int tp_group, v1::OwnedTensor& o) {
  const int64_t shard = o.numel() * kTpOpBytesPerElem;
  if (ns_rank < 0) {
    o.set_tp_op(v1::TP_OP_NONE);
    o.set_tp_group(-1);
    o.set_ns_tp_rank(-1);
    return;
  }
  o.set_tp_group(tp_group);
  if (mode == v1::TP_MUON_DUPLICATED) {
    o.set_tp_op(v1::TP_OP_ALL_GATHER);
    o.set_ns_tp_rank(-1);
    o.set_tp_send_bytes((tp - 1) * shard);  // ring all-gather: tp - 1 shards through every rank
    o.set_tp_recv_bytes((tp - 1) * shard);
    return;
  }
  o.set_tp_op(v1::TP_OP_GATHER_SCATTER);
  o.set_ns_tp_rank(ns_rank);
  const bool runs_ns = t == ns_rank;
  o.set_tp_send_bytes(runs_ns ? (tp - 1) * shard : shard);  // scatter out, or its shard in
  o.set_tp_recv_bytes(runs_ns ? (tp - 1) * shard : shard);
  if (!runs_ns) o.set_ns_flops(0);
}

// Rank `q * tp + t`'s copy of replica rank q's owned matrix under
// TP_MUON_SHARDED: NS on its own shard, the Gram matrices all-reduced (a
// ring: 2 (tp - 1) / tp of them through every rank).
void SetTpSharded(const ShardedNs& ns, int steps, int tp, int tp_group, v1::OwnedTensor& o) {
  const int64_t matrices = o.matrix_end() - o.matrix_begin();
  const int64_t bytes = 2 * (tp - 1) * matrices * ns.AllReducedFloats(steps) * kTpOpBytesPerElem / tp;
  o.set_tp_op(v1::TP_OP_SHARDED_NS);
  o.set_tp_group(tp_group);
  o.set_ns_tp_rank(-1);
  o.set_tp_send_bytes(bytes);
  o.set_tp_recv_bytes(bytes);
  o.set_ns_flops(static_cast<double>(matrices) * ns.Flops(steps));
}

// Rank `q * tp + t`'s copy of replica rank q's owned matrix whose blocks
// align with the split: the blocks of its own shard, nothing moved.
void SetTpLocal(const v1::PlannedTensor& tensor, int steps, int tp, int t, int tp_group, v1::OwnedTensor& o) {
  o.set_tp_op(v1::TP_OP_LOCAL);
  o.set_tp_group(tp_group);
  o.set_ns_tp_rank(-1);
  o.set_tp_send_bytes(0);
  o.set_tp_recv_bytes(0);
  o.set_ns_flops((o.matrix_end() - o.matrix_begin()) * PlannedMatrixNsFlops(tensor, steps, tp, t));
}

// Rank q * tp + t: replica rank q's dense matrices and slices (the TP op of
// every split matrix), then, with ep > 1, its own experts' from the expert
// plan.
void ExpandRanks(const TpParts& parts, const RankLayout& layout, v1::Plan* out) {
  const int tp = layout.tp();
  const v1::TpMuonMode mode = out->policy().tp_muon();
  const int muon_base = parts.dense->muon_buckets_size() * tp;
  const int adamw_base = parts.dense->adamw_buckets_size() * tp;
  std::vector<double> across(layout.block(), 0);
  const HandOff hand_off = HandOffOf(*parts.dense, parts.dense_index);
  for (const v1::RankPlan& q : parts.dense->ranks()) {
    v1::RankPlan remapped = q;
    for (v1::OwnedTensor& o : *remapped.mutable_owned()) RemapTensor(parts.dense_index, o);
    for (v1::TensorSlice& s : *remapped.mutable_slices()) RemapTensor(parts.dense_index, s);
    const std::vector<int> ns_rank = AssignNsRanks(remapped, *out, layout, hand_off, across);
    for (int t = 0; t < tp; ++t) {
      v1::RankPlan* r = out->add_ranks();
      *r = remapped;
      const int rank = q.rank() * tp + t;
      r->set_rank(rank);
      r->set_stage(layout.StageOf(rank));
      r->set_ep_rank(layout.EpRankOf(rank));
      r->set_sharding_rank(layout.ShardingRankOf(rank));
      r->set_moe_sharding_rank(layout.MoeShardingRankOf(rank));
      r->set_tp_rank(t);
      int64_t send = 0, recv = 0;
      for (int k = 0; k < r->owned_size(); ++k) {
        v1::OwnedTensor& o = *r->mutable_owned(k);
        o.set_bucket(o.bucket() * tp + t);
        const v1::PlannedTensor& tensor = out->tensors(o.tensor());
        const std::optional<ShardedNs> sharded = mode == v1::TP_MUON_SHARDED ? ShardedNsOf(tensor) : std::nullopt;
        if (tensor.ns_local()) {
          SetTpLocal(tensor, out->policy().ns_steps(), tp, t, layout.TpGroupOf(rank), o);
        } else if (sharded.has_value()) {
          SetTpSharded(*sharded, out->policy().ns_steps(), tp, layout.TpGroupOf(rank), o);
        } else {
          SetTpOp(mode, tp, t, ns_rank[k], layout.TpGroupOf(rank), o);
        }
        send += o.tp_send_bytes();
        recv += o.tp_recv_bytes();
      }
      for (v1::TensorSlice& s : *r->mutable_slices()) s.set_bucket(s.bucket() * tp + t);
      if (parts.experts != nullptr) {
        const v1::RankPlan& e = parts.experts->ranks(rank);
        for (const v1::OwnedTensor& from : e.owned()) {
          v1::OwnedTensor* o = r->add_owned();
          *o = from;
          RemapTensor(parts.expert_index, *o);
          o->set_bucket(muon_base + from.bucket());
          SetTpOp(mode, tp, t, /*ns_rank=*/-1, -1, *o);
        }
        for (const v1::TensorSlice& from : e.slices()) {
          v1::TensorSlice* s = r->add_slices();
          *s = from;
          RemapTensor(parts.expert_index, *s);
          s->set_bucket(adamw_base + from.bucket());
        }
      }
      r->set_tp_send_bytes(send);
      r->set_tp_recv_bytes(recv);
    }
  }
}

// The largest Muon matrix: its shard for memory, its whole for FLOPs (a
// tp rank's blocks when they align with the split).
void LargestMatrix(const v1::Plan& plan, int64_t* state_bytes, double* flops) {
  *state_bytes = 0;
  *flops = 0;
  for (const v1::PlannedTensor& t : plan.tensors()) {
    if (t.optimizer() != v1::MUON) continue;
    *state_bytes = std::max(*state_bytes, MatrixStateBytes(t));
    *flops = std::max(*flops, LargestPlannedMatrixNsFlops(t, plan.policy().ns_steps(), plan.topology().tp()));
  }
}

}  // namespace

namespace {

// Manifest tensors `tensors` with their stages pinned to the whole model's
// (a part lacks the layers that place the rest).
v1::ModelManifest Subset(const v1::ModelManifest& manifest, const std::vector<int>& tensors,
                         const ResolvedModel& whole) {
  v1::ModelManifest part;
  part.set_model(manifest.model());
  for (int i : tensors) {
    v1::TensorSpec& t = *part.add_tensors();
    t = manifest.tensors(i);
    t.set_stage(whole.tensors[i].stage);
  }
  return part;
}

}  // namespace

TpReplica ReplicaOf(const v1::ModelManifest& manifest, const RankLayout& layout, const std::vector<int>& tensors,
                    const ResolvedModel& whole) {
  TpReplica replica{Subset(manifest, tensors, whole), layout.Resolved()};
  for (v1::TensorSpec& t : *replica.manifest.mutable_tensors()) {
    if (t.tp_mesh_split_size() > 0 && IsSplitSpec(t)) {  // every tile has tile 0's shape
      const TpTile tile =
          TpTileOf(t.shape(), t.layout(), layout.tp_mesh(), MeshSplitOf(t.tp_mesh_split(), t.tp_split()), /*k=*/0);
      t.mutable_shape()->Assign(tile.shape.begin(), tile.shape.end());
    } else if (IsSplit(t.tp_split())) {
      const int dim = TpSplitDim(t.shape_size(), t.layout(), t.tp_split());
      t.set_shape(dim, t.shape(dim) / layout.tp());
      t.clear_ns_blocks();  // they tile the whole tensor; its FLOPs come from UseWholeMatricesForNs
    }
    t.clear_tp_split();
    t.clear_tp_mesh_split();
  }
  replica.topology.clear_tp_mesh();
  replica.topology.set_world_size(layout.world_size() / layout.tp());
  replica.topology.set_ep(std::max(1, layout.ep() / layout.tp()));
  replica.topology.set_tp(1);
  return replica;
}

TpReplica ExpertsOf(const v1::ModelManifest& manifest, const RankLayout& layout, const std::vector<int>& tensors,
                    const ResolvedModel& whole) {
  TpReplica experts{Subset(manifest, tensors, whole), layout.Resolved()};
  experts.topology.set_tp(1);
  experts.topology.clear_tp_mesh();
  return experts;
}

void SplitDenseAndExperts(const ResolvedModel& whole, const RankLayout& layout, std::vector<int>* dense,
                          std::vector<int>* experts) {
  for (int i = 0; i < static_cast<int>(whole.tensors.size()); ++i) {
    const ResolvedTensor& t = whole.tensors[i];
    (layout.ep() > 1 && (t.expert >= 0 || t.stack) ? experts : dense)->push_back(i);
  }
}

void UseWholeMatricesForNs(const ResolvedModel& whole, const std::vector<int>& tensors, ResolvedModel& replica) {
  for (size_t k = 0; k < replica.tensors.size(); ++k) {
    const ResolvedTensor& w = whole.tensors[tensors[k]];
    replica.tensors[k].ns_rows = w.rows;
    replica.tensors[k].ns_cols = w.cols;
    replica.tensors[k].ns_flops_per_step = w.ns_flops_per_step;
    replica.tensors[k].ns_local = w.ns_local;
  }
}

Preload RankPreload(const v1::Plan& plan, AdamwPreload adamw) {
  Preload preload;
  std::vector<double> adamw_sum(plan.topology().pp(), 0), ranks(plan.topology().pp(), 0);
  for (const v1::RankPlan& r : plan.ranks()) {
    int64_t muon = 0;
    for (const v1::OwnedTensor& o : r.owned()) {
      muon += o.numel() * MuonStateBytesPerElem(plan.tensors(o.tensor()).dtype());
    }
    preload.ns_flops.push_back(r.ns_flops());
    preload.state_bytes.push_back(muon);
    adamw_sum[r.stage()] += static_cast<double>(r.optimizer_state_bytes() - muon);
    ranks[r.stage()] += 1;
  }
  if (adamw == AdamwPreload::kWater) {
    preload.stage_water_bytes = std::move(adamw_sum);
    return preload;
  }
  for (int k = 0; k < plan.ranks_size(); ++k) {
    const int stage = plan.ranks(k).stage();
    preload.state_bytes[k] += static_cast<int64_t>(adamw_sum[stage] / ranks[stage]);
  }
  return preload;
}

Preload ReplicaPreload(const v1::Plan& experts, int tp) {
  const int replicas = experts.ranks_size() / tp;
  Preload preload;
  preload.ns_flops.assign(replicas, 0);
  preload.state_bytes.assign(replicas, 0);
  for (const v1::RankPlan& r : experts.ranks()) {
    const int q = r.rank() / tp;
    preload.ns_flops[q] += r.ns_flops();
    preload.state_bytes[q] = std::max(preload.state_bytes[q], r.optimizer_state_bytes());
  }
  return preload;
}

v1::PlanRequest WholeModelRequest(const v1::PlanRequest& request) {
  const int tp = request.topology().tp();
  if (tp <= 1) return request;
  v1::PlanRequest whole = request;
  for (v1::TensorSpec& t : *whole.mutable_manifest()->mutable_tensors()) {
    t.clear_tp_split();
    t.clear_tp_mesh_split();
  }
  whole.mutable_topology()->clear_tp_mesh();
  whole.mutable_topology()->set_world_size(request.topology().world_size() / tp);
  if (request.topology().ep() > 1) whole.mutable_topology()->set_ep(std::max(1, request.topology().ep() / tp));
  whole.mutable_topology()->set_tp(1);
  whole.mutable_policy()->clear_tp_muon();
  return whole;
}

void ExpandTensorParallel(const TpParts& parts, const v1::ModelManifest& manifest, const RankLayout& layout,
                          v1::Plan* out) {
  const v1::Plan& dense = *parts.dense;
  out->set_format_version(dense.format_version());
  out->set_content_hash(dense.content_hash());
  out->set_model(manifest.model());
  *out->mutable_topology() = layout.Resolved();
  *out->mutable_policy() = dense.policy();
  for (int g = 0; g < layout.num_groups(); ++g) *out->add_groups() = layout.GroupProto(g);
  ExpandTensors(SourcesOf(parts, manifest.tensors_size()), manifest, layout, out);
  const v1::Plan* experts = parts.experts;
  ExpandBuckets(dense.muon_buckets(), experts ? &experts->muon_buckets() : nullptr, parts, layout,
                out->mutable_muon_buckets());
  ExpandBuckets(dense.adamw_buckets(), experts ? &experts->adamw_buckets() : nullptr, parts, layout,
                out->mutable_adamw_buckets());
  ExpandRanks(parts, layout, out);
  int64_t max_state_bytes = 0;
  double max_flops = 0;
  LargestMatrix(*out, &max_state_bytes, &max_flops);
  *out->mutable_stats() = ComputePlanStats(*out, max_state_bytes, max_flops);
}

}  // namespace muonshard::planner
