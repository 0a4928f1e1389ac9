#include "plan/plan_builder.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/bucketing.h"
#include "plan/node_grid.h"
#include "plan/water_fill.h"

namespace muonshard::planner {

PlanBuilder::PlanBuilder(const v1::ModelManifest& manifest, const v1::PlanPolicy& policy, const RankLayout& layout,
                         ResolvedModel model, const v1::Plan* previous)
    : manifest_(manifest), policy_(policy), layout_(layout), model_(std::move(model)), previous_(previous) {}

PlanBuilder::~PlanBuilder() {
  if (plan_ != nullptr && plan_->GetArena() == nullptr) delete plan_;
}

absl::StatusOr<v1::Plan*> PlanBuilder::Build(google::protobuf::Arena* arena) {
  plan_ = google::protobuf::Arena::CreateMessage<v1::Plan>(arena);
  plan_->set_model(manifest_.model());
  *plan_->mutable_topology() = layout_.Resolved();
  *plan_->mutable_policy() = policy_;
  EmitGroups();
  EmitRanks();
  EmitTensors();
  std::vector<MuonShard> shards;
  if (fixed_muon_ != nullptr) {
    shards = *fixed_muon_;
  } else {
    MUONSHARD_ASSIGN_OR_RETURN(shards, PartitionMuon());
  }
  EmitMuonBuckets(shards);
  muon_shards_ = std::move(shards);
  EmitAdamwBuckets();
  AddBucketTotals(*plan_, totals_);
  *plan_->mutable_stats() = ComputePlanStats(*plan_, totals_, CountParams(), MaxMatrixStateBytes(), MaxMatrixFlops());
  v1::Plan* result = plan_;
  plan_ = nullptr;
  return result;
}

void PlanBuilder::EmitGroups() {
  for (int g = 0; g < layout_.num_groups(); ++g) *plan_->add_groups() = layout_.GroupProto(g);
}

void PlanBuilder::EmitRanks() {
  totals_.assign(layout_.world_size(), RankTotals());
  plan_->mutable_ranks()->Reserve(layout_.world_size());
  for (int r = 0; r < layout_.world_size(); ++r) {
    v1::RankPlan* rp = plan_->add_ranks();
    rp->set_rank(r);
    rp->set_stage(layout_.StageOf(r));
    rp->set_ep_rank(layout_.EpRankOf(r));
    rp->set_sharding_rank(layout_.ShardingRankOf(r));
    rp->set_moe_sharding_rank(layout_.MoeShardingRankOf(r));
    rp->set_tp_rank(layout_.TpRankOf(r));
  }
}

// One pass over the manifest; units are tensor-major, so each tensor's
// parts are the next units in order.
void PlanBuilder::EmitTensors() {
  const v1::ModelManifest& m = manifest_;
  plan_->mutable_tensors()->Reserve(m.tensors_size());
  size_t u = 0;
  for (int i = 0; i < m.tensors_size(); ++i) {
    const v1::TensorSpec& spec = m.tensors(i);
    const ResolvedTensor& r = model_.tensors[i];
    v1::PlannedTensor* t = plan_->add_tensors();
    t->set_name(spec.name());
    *t->mutable_shape() = spec.shape();
    t->set_dtype(spec.dtype());
    t->set_optimizer(r.muon ? v1::MUON : v1::ADAMW);
    t->set_layout(r.layout);
    t->set_stage(r.stage);
    t->set_expert(r.expert);
    t->set_numel(r.numel);
    if (spec.has_ns_blocks()) *t->mutable_ns_blocks() = spec.ns_blocks();
    for (; u < model_.units.size() && model_.units[u].tensor == i; ++u) {
      const Unit& unit = model_.units[u];
      t->set_colour(layout_.GroupColour(unit.group));
      v1::TensorPart* part = t->add_parts();
      part->set_group(unit.group);
      part->set_element_begin(unit.elem_begin);
      part->set_element_end(unit.elem_begin + unit.numel);
      part->set_matrix_begin(unit.matrix_begin);
      part->set_matrix_end(unit.matrix_end);
    }
  }
}

absl::StatusOr<std::vector<MuonShard>> PlanBuilder::PartitionMuon() {
  switch (policy_.policy()) {
    case v1::SEED:
    case v1::SEED_ALL:
      return SeedPartitionMuon(model_, layout_, policy_.comm_buffer_mb(), policy_.policy() == v1::SEED_ALL,
                               policy_.per_dtype());
    case v1::BALANCED:
      return PartitionBalanced();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("policy.policy: unknown value ", static_cast<int>(policy_.policy())));
  }
}

std::vector<MuonShard> PlanBuilder::PartitionBalanced() {
  BalancedOptions options;
  options.ns_steps = policy_.ns_steps();
  options.per_dtype = policy_.per_dtype();
  options.preload = preload_;
  options.memory_only = memory_only_;
  options.dense_runs = dense_runs_;
  absl::flat_hash_map<std::pair<int, int>, int> previous_owner;
  if (previous_ != nullptr) {
    previous_owner = PreviousOwners();
    options.previous_owner = &previous_owner;
  }
  std::vector<MuonShard> balanced = BalancedPartitionMuon(model_, layout_, options);
  // Sticky: fewer moves, not the seed; memory only: the seed's objective
  // weighs FLOPs; runs: the objective counts a gathered matrix's share of
  // NS, not the run's per rank (the caller compares the merged plans).
  if (previous_ != nullptr || memory_only_ || dense_runs_ > 1) return balanced;
  // Never worse than the seed policy: keep its assignment (water-filled all
  // the same) on the rare manifest where it scores better.
  std::vector<MuonShard> seed =
      SeedPartitionMuon(model_, layout_, policy_.comm_buffer_mb(), /*all_ranks=*/false, policy_.per_dtype());
  const int steps = policy_.ns_steps();
  if (AssignmentObjective(model_, layout_, seed, steps, preload_) <
      AssignmentObjective(model_, layout_, balanced, steps, preload_)) {
    return seed;
  }
  return balanced;
}

// (tensor index in this manifest, matrix) -> previous owner's global rank.
absl::flat_hash_map<std::pair<int, int>, int> PlanBuilder::PreviousOwners() const {
  absl::flat_hash_map<std::string, int> index;
  for (int i = 0; i < manifest_.tensors_size(); ++i) index[manifest_.tensors(i).name()] = i;
  absl::flat_hash_map<std::pair<int, int>, int> owners;
  for (const v1::RankPlan& r : previous_->ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      auto found = index.find(previous_->tensors(o.tensor()).name());
      if (found == index.end()) continue;
      for (int m = o.matrix_begin(); m < o.matrix_end(); ++m) owners[{found->second, m}] = r.rank();
    }
  }
  return owners;
}

PlanBuilder::OwnedShard PlanBuilder::Gather(const MuonShard& s) const {
  const Unit& u = model_.units[s.unit];
  const ResolvedTensor& t = model_.tensors[u.tensor];
  const int64_t matrix_numel = t.rows * t.cols;
  const int matrices = s.matrix_end - s.matrix_begin;
  return OwnedShard{s.unit,
                    u.tensor,
                    s.matrix_begin,
                    s.matrix_end,
                    t.dtype,
                    t.esize,
                    int64_t{s.matrix_begin} * matrix_numel,
                    matrices * matrix_numel,
                    matrices * MatrixNsFlops(t, policy_.ns_steps())};
}

// Per group and owner (ascending), the owner's shards in manifest order,
// fused by assign_group_by_size with 256-byte alignment per tensor.
void PlanBuilder::EmitMuonBuckets(const std::vector<MuonShard>& shards) {
  // Counting sort by (group, owner) -- O(shards + ranks) -- then each
  // owner's shards in manifest order (already so unless a policy made
  // several passes, e.g. per dtype).
  std::vector<int> group_base(plan_->groups_size() + 1, 0);
  for (int g = 0; g < plan_->groups_size(); ++g) {
    group_base[g + 1] = group_base[g] + plan_->groups(g).ranks_size();
  }
  auto key = [&](const MuonShard& s) { return group_base[model_.units[s.unit].group] + s.owner; };
  std::vector<int> start(group_base.back() + 1, 0);
  for (const MuonShard& s : shards) ++start[key(s) + 1];
  for (size_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
  std::vector<OwnedShard> sorted(shards.size());
  std::vector<int> fill(start.begin(), start.end() - 1);
  for (const MuonShard& s : shards) sorted[fill[key(s)]++] = Gather(s);
  for (int g = 0; g < plan_->groups_size(); ++g) {
    const v1::CommGroup& group = plan_->groups(g);
    const int size = group_base[g + 1] - group_base[g];
    // NOTE [Expert owners across nodes]: an expert group's owners from its
    // rotation on, round its ranks.
    const int rotation = group.colour() == v1::MOE_EXPERT
                             ? ExpertOwnerRotation(group.ranks(), layout_.gpus_per_node(), group.ep_rank())
                             : 0;
    for (int i = 0; i < size; ++i) {
      const int k = group_base[g] + (rotation + i) % size;
      if (start[k] == start[k + 1]) continue;
      auto first = sorted.begin() + start[k], last = sorted.begin() + start[k + 1];
      auto by_unit = [](const OwnedShard& a, const OwnedShard& b) {
        return std::tie(a.unit, a.matrix_begin) < std::tie(b.unit, b.matrix_begin);
      };
      if (!std::is_sorted(first, last, by_unit)) std::sort(first, last, by_unit);
      v1::RankPlan* owner = plan_->mutable_ranks(group.ranks(k - group_base[g]));
      owner->mutable_owned()->Reserve(owner->owned_size() + static_cast<int>(last - first));
      EmitOwnerBuckets(g, absl::MakeConstSpan(&*first, last - first), owner);
    }
  }
}

void PlanBuilder::EmitOwnerBuckets(int group, absl::Span<const OwnedShard> owned, v1::RankPlan* owner) {
  RankTotals& totals = totals_[owner->rank()];
  std::vector<v1::DType> dtypes;
  std::vector<int64_t> numels;
  dtypes.reserve(owned.size());
  numels.reserve(owned.size());
  for (const OwnedShard& s : owned) {
    dtypes.push_back(s.dtype);
    numels.push_back(s.numel);
  }
  for (const std::vector<int>& members : AssignGroupBySize(dtypes, numels, limit_bytes())) {
    v1::MuonBucket* b = plan_->add_muon_buckets();
    b->set_id(plan_->muon_buckets_size() - 1);
    b->set_group(group);
    b->set_owner(owner->rank());
    b->set_dtype(dtypes[members[0]]);
    b->mutable_entries()->Reserve(static_cast<int>(members.size()));
    int64_t offset = 0;
    for (int k : members) {
      const OwnedShard& s = owned[k];
      v1::BucketEntry* e = b->add_entries();
      e->set_tensor(s.tensor);
      e->set_element_begin(s.element_begin);
      e->set_numel(s.numel);
      e->set_offset(offset);
      e->set_padded_numel(ReducePaddedNumel(s.numel, s.esize));
      offset += e->padded_numel();

      v1::OwnedTensor* o = owner->add_owned();
      o->set_tensor(s.tensor);
      o->set_matrix_begin(s.matrix_begin);
      o->set_matrix_end(s.matrix_end);
      o->set_numel(s.numel);
      o->set_ns_flops(s.ns_flops);
      o->set_bucket(b->id());
      totals.muon_numel += s.numel;
      totals.muon_state_bytes += s.numel * MuonStateBytesPerElem(s.dtype);
      totals.ns_flops += s.ns_flops;
    }
    b->set_numel(offset);
  }
}

// Per group: AdamW units in manifest order, stable-sorted by dtype name,
// fused by assign_group_by_size. Seed policies pad each entry to
// (256 / esize) * n elements and split every buffer evenly; `balanced` pads
// to 256 bytes and water-fills uneven shards around the Muon load.
void PlanBuilder::EmitAdamwBuckets() {
  const bool balanced = policy_.policy() == v1::BALANCED;
  std::vector<std::vector<int>> buckets_of(layout_.num_groups());
  for (int g = 0; g < layout_.num_groups(); ++g) {
    std::vector<int> units = model_.adamw_units[g];
    if (units.empty()) continue;
    std::stable_sort(units.begin(), units.end(), [&](int a, int b) {
      return DTypeNameLess(model_.tensors[model_.units[a].tensor].dtype, model_.tensors[model_.units[b].tensor].dtype);
    });
    std::vector<v1::DType> dtypes;
    std::vector<int64_t> numels;
    for (int u : units) {
      dtypes.push_back(model_.tensors[model_.units[u].tensor].dtype);
      numels.push_back(model_.units[u].numel);
    }
    for (const std::vector<int>& members : AssignGroupBySize(dtypes, numels, limit_bytes())) {
      std::vector<int> bucket_units;
      bucket_units.reserve(members.size());
      for (int k : members) bucket_units.push_back(units[k]);
      buckets_of[g].push_back(EmitAdamwLayout(g, bucket_units, balanced));
    }
  }
  if (balanced) {
    WaterFillAdamw(buckets_of);
  } else {
    for (v1::AdamwBucket& b : *plan_->mutable_adamw_buckets()) {
      for (int64_t o : EvenShards(b.numel(), plan_->groups(b.group()).ranks_size())) b.add_shard_offsets(o);
    }
  }
  for (const v1::AdamwBucket& b : plan_->adamw_buckets()) EmitSlices(b);
}

int PlanBuilder::EmitAdamwLayout(int group, const std::vector<int>& units, bool balanced) {
  const int n = plan_->groups(group).ranks_size();
  v1::AdamwBucket* b = plan_->add_adamw_buckets();
  b->set_id(plan_->adamw_buckets_size() - 1);
  b->set_group(group);
  b->set_dtype(model_.tensors[model_.units[units[0]].tensor].dtype);
  int64_t offset = 0;
  for (int u : units) {
    const Unit& unit = model_.units[u];
    const int esize = model_.tensors[unit.tensor].esize;
    v1::BucketEntry* e = b->add_entries();
    e->set_tensor(unit.tensor);
    e->set_element_begin(unit.elem_begin);
    e->set_numel(unit.numel);
    e->set_offset(offset);
    e->set_padded_numel(balanced ? ReducePaddedNumel(unit.numel, esize)
                                 : ReduceScatterPaddedNumel(unit.numel, esize, n));
    offset += e->padded_numel();
  }
  b->set_numel(offset);
  return b->id();
}

// Expert groups first (their ranks are fixed), then each stage's sharding
// group levels every rank's total around its Muon and expert load.
void PlanBuilder::WaterFillAdamw(const std::vector<std::vector<int>>& buckets_of) {
  std::vector<int64_t> base(layout_.world_size(), 0);
  if (preload_ != nullptr) base = preload_->state_bytes;
  for (const v1::RankPlan& r : plan_->ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      base[r.rank()] += o.numel() * MuonStateBytesPerElem(plan_->tensors(o.tensor()).dtype());
    }
  }
  std::vector<int> order;
  for (int g = layout_.pp(); g < layout_.num_groups(); ++g) order.push_back(g);
  for (int g = 0; g < layout_.pp(); ++g) order.push_back(g);
  for (int g : order) {
    if (buckets_of[g].empty()) continue;
    const v1::CommGroup& group = plan_->groups(g);
    std::vector<int64_t> numels, align, state, group_base;
    for (int id : buckets_of[g]) {
      const v1::DType dtype = plan_->adamw_buckets(id).dtype();
      numels.push_back(plan_->adamw_buckets(id).numel());
      align.push_back(kAlignBytes / DTypeSize(dtype));
      state.push_back(AdamwStateBytesPerElem(dtype));
    }
    for (int r : group.ranks()) group_base.push_back(base[r]);
    std::vector<ShardOffsets> offsets = WaterFill(numels, align, state, group_base);
    for (size_t k = 0; k < buckets_of[g].size(); ++k) {
      for (int64_t o : offsets[k]) plan_->mutable_adamw_buckets(buckets_of[g][k])->add_shard_offsets(o);
    }
    for (int i = 0; i < group.ranks_size(); ++i) base[group.ranks(i)] = group_base[i];
  }
}

// Each group rank's piece of every entry overlapping its shard: Paddle's
// [max(index, rank_begin), min(index + padded, rank_end)), clipped to numel.
void PlanBuilder::EmitSlices(const v1::AdamwBucket& b) {
  const v1::CommGroup& g = plan_->groups(b.group());
  size_t first = 0;
  for (int i = 0; i < g.ranks_size(); ++i) {
    const int64_t rb = b.shard_offsets(i);
    const int64_t re = b.shard_offsets(i + 1);
    while (first < static_cast<size_t>(b.entries_size()) &&
           b.entries(first).offset() + b.entries(first).padded_numel() <= rb) {
      ++first;
    }
    v1::RankPlan* rank = plan_->mutable_ranks(g.ranks(i));
    RankTotals& totals = totals_[g.ranks(i)];
    for (size_t k = first; k < static_cast<size_t>(b.entries_size()); ++k) {
      const v1::BucketEntry& e = b.entries(k);
      if (e.offset() >= re) break;
      const int64_t begin = std::max(e.offset(), rb) - e.offset();
      const int64_t end = std::min(e.offset() + e.padded_numel(), re) - e.offset();
      if (begin >= end || begin >= e.numel()) continue;  // empty shard, or only padding
      v1::TensorSlice* s = rank->add_slices();
      s->set_tensor(e.tensor());
      s->set_begin(e.element_begin() + begin);
      s->set_end(e.element_begin() + std::min(end, e.numel()));
      s->set_padding(end - std::max(begin, e.numel()) > 0 ? end - std::max(begin, e.numel()) : 0);
      s->set_bucket(b.id());
      totals.adamw_numel += s->end() - s->begin();
    }
  }
}

ParamCounts PlanBuilder::CountParams() const {
  ParamCounts c;
  for (const ResolvedTensor& t : model_.tensors) c.Add(t.numel, t.muon);
  return c;
}

int64_t PlanBuilder::MaxMatrixStateBytes() const {
  int64_t best = 0;
  for (const ResolvedTensor& t : model_.tensors) {
    if (t.muon) best = std::max(best, t.rows * t.cols * MuonStateBytesPerElem(t.dtype));
  }
  return best;
}

double PlanBuilder::MaxMatrixFlops() const {
  double best = 0;
  for (const ResolvedTensor& t : model_.tensors) {
    if (t.muon) best = std::max(best, MatrixNsFlops(t, policy_.ns_steps()));
  }
  return best;
}

}  // namespace muonshard::planner
