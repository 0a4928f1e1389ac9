#include "plan/planner.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <numeric>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "plan/balanced.h"
#include "plan/bucketing.h"
#include "plan/memory.h"
#include "plan/model.h"
#include "plan/partition.h"
#include "plan/plan_stats.h"
#include "plan/tensor_parallel.h"
#include "plan/topology.h"
#include "plan/transfer.h"

namespace muonshard::planner {
namespace {

constexpr int kDefaultBufferMb = 256;
constexpr int kDefaultNsSteps = 5;

absl::StatusOr<v1::PlanPolicy> CanonicalPolicy(const v1::PlanPolicy& in, int tp) {
  v1::PlanPolicy p = in;
  if (!v1::TpMuonMode_IsValid(p.tp_muon())) {
    return absl::InvalidArgumentError(absl::StrCat("policy.tp_muon: unknown value ", p.tp_muon()));
  }
  if (tp == 1) {
    p.clear_tp_muon();  // meaningless without tensor parallelism; tp 1 requests hash as before
  } else if (p.tp_muon() == v1::TP_MUON_UNSPECIFIED) {
    p.set_tp_muon(v1::TP_MUON_DISTRIBUTED);
  }
  if (!v1::Policy_IsValid(p.policy())) {
    return absl::InvalidArgumentError(absl::StrCat("policy.policy: unknown value ", p.policy()));
  }
  if (p.policy() == v1::POLICY_UNSPECIFIED) p.set_policy(v1::SEED);
  if (p.comm_buffer_mb() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("policy.comm_buffer_mb: must be >= 0, got ", p.comm_buffer_mb()));
  }
  if (p.comm_buffer_mb() == 0) p.set_comm_buffer_mb(kDefaultBufferMb);
  if (p.ns_steps() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("policy.ns_steps: must be >= 0, got ", p.ns_steps()));
  }
  if (p.ns_steps() == 0) p.set_ns_steps(kDefaultNsSteps);
  if (p.muon_exclude_patterns().empty()) {
    for (const std::string& s : DefaultExcludePatterns()) p.add_muon_exclude_patterns(s);
  }
  if (p.grad_dtype() == v1::DTYPE_UNSPECIFIED) p.set_grad_dtype(v1::FP32);
  if (!p.sticky_to().empty() && p.policy() != v1::BALANCED) {
    return absl::InvalidArgumentError("policy.sticky_to: sticky re-planning needs policy BALANCED");
  }
  if (DTypeSize(p.grad_dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("policy.grad_dtype: unknown value ", p.grad_dtype()));
  }
  return p;
}

// SHA-256 of the deterministic serialization of a PlanRequest with all three
// fields set, streamed field by field so the manifest is never copied: the
// serializer writes into one reused chunk that is hashed whenever it fills
// (a manifest of ~70k tensors serializes to megabytes).
class Sha256Sink final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  Sha256Sink() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256Sink() override { EVP_MD_CTX_free(ctx_); }
  Sha256Sink(const Sha256Sink&) = delete;
  Sha256Sink& operator=(const Sha256Sink&) = delete;

  // ZeroCopyOutputStream: hands out the chunk, hashing what it held.
  bool Next(void** data, int* size) override {
    Flush();
    *data = chunk_.data();
    *size = static_cast<int>(chunk_.size());
    used_ = chunk_.size();
    return true;
  }
  void BackUp(int count) override { used_ -= static_cast<size_t>(count); }
  int64_t ByteCount() const override { return hashed_ + static_cast<int64_t>(used_); }

  std::string HexDigest() {
    Flush();
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest;
    unsigned int size = 0;
    EVP_DigestFinal_ex(ctx_, digest.data(), &size);
    return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest.data()), size));
  }

 private:
  void Flush() {
    EVP_DigestUpdate(ctx_, chunk_.data(), used_);
    hashed_ += static_cast<int64_t>(used_);
    used_ = 0;
  }

  EVP_MD_CTX* ctx_;
  std::array<char, 64 << 10> chunk_;
  size_t used_ = 0;
  int64_t hashed_ = 0;
};

// Appends field `field` (length-delimited) holding `m` to the stream, as a
// deterministic serialization of the enclosing message would.
void AddField(int field, const google::protobuf::Message& m, Sha256Sink& sink) {
  const size_t size = m.ByteSizeLong();
  google::protobuf::io::CodedOutputStream out(&sink);
  out.SetSerializationDeterministic(true);
  out.WriteTag(google::protobuf::internal::WireFormatLite::MakeTag(
      field, google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
  out.WriteVarint32(static_cast<uint32_t>(size));
  m.SerializeWithCachedSizes(&out);
}

std::string HashRequestParts(const v1::ModelManifest& manifest, const v1::Topology& topology,
                             const v1::PlanPolicy& policy) {
  // 64 KiB chunk: on the heap, not the stack.
  auto sink = std::make_unique<Sha256Sink>();
  AddField(v1::PlanRequest::kManifestFieldNumber, manifest, *sink);
  AddField(v1::PlanRequest::kTopologyFieldNumber, topology, *sink);
  AddField(v1::PlanRequest::kPolicyFieldNumber, policy, *sink);
  return absl::StrCat("sha256:", sink->HexDigest());
}

// Builds the plan from a canonical request; one object so the steps share
// the resolved model without long parameter lists.
class PlanBuilder {
 public:
  PlanBuilder(const v1::ModelManifest& manifest, const v1::PlanPolicy& policy, const RankLayout& layout,
              ResolvedModel model, const v1::Plan* previous)
      : manifest_(manifest), policy_(policy), layout_(layout), model_(std::move(model)), previous_(previous) {}

  // Load from outside this plan for the balanced policy to level around
  // (balanced.h); null for none. Must outlive Build.
  void set_preload(const Preload* preload) { preload_ = preload; }
  // The Muon assignment to use instead of the policy's (another build's
  // muon_shards() of the same model and layout); null for the policy's.
  void set_fixed_muon(const std::vector<MuonShard>* shards) { fixed_muon_ = shards; }
  // Balanced: level optimizer-state bytes only (BalancedOptions.memory_only).
  void set_memory_only(bool memory_only) { memory_only_ = memory_only; }
  // Balanced: BalancedOptions.dense_runs.
  void set_dense_runs(int runs) { dense_runs_ = runs; }
  // After Build: the Muon assignment it used.
  const std::vector<MuonShard>& muon_shards() const { return muon_shards_; }

  // Builds into a Plan allocated on `arena` (heap when null).
  absl::StatusOr<v1::Plan*> Build(std::string hash, google::protobuf::Arena* arena) {
    plan_ = google::protobuf::Arena::CreateMessage<v1::Plan>(arena);
    plan_->set_format_version(kPlanFormatVersion);
    plan_->set_content_hash(std::move(hash));
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

  ~PlanBuilder() {
    if (plan_ != nullptr && plan_->GetArena() == nullptr) delete plan_;
  }

 private:
  int64_t limit_bytes() const { return int64_t{policy_.comm_buffer_mb()} << 20; }
  int grad_esize() const { return DTypeSize(policy_.grad_dtype()); }

  void EmitGroups() {
    for (int g = 0; g < layout_.num_groups(); ++g) *plan_->add_groups() = layout_.GroupProto(g);
  }

  void EmitRanks() {
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
  void EmitTensors() {
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

  absl::StatusOr<std::vector<MuonShard>> PartitionMuon() {
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

  std::vector<MuonShard> PartitionBalanced() {
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
  absl::flat_hash_map<std::pair<int, int>, int> PreviousOwners() const {
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

  // A Muon shard with everything its bucket entry and owned record need,
  // gathered while the shards are still in manifest order: the per-owner
  // emission then reads one array in order, not the tensor table at random.
  struct OwnedShard {
    int unit;
    int tensor;
    int matrix_begin;
    int matrix_end;
    v1::DType dtype;
    int esize;
    int64_t element_begin;
    int64_t numel;
    double ns_flops;
  };

  OwnedShard Gather(const MuonShard& s) const {
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
                      matrices * NsFlops(t.ns_rows, t.ns_cols, policy_.ns_steps())};
  }

  // Per group and owner (ascending), the owner's shards in manifest order,
  // fused by assign_group_by_size with 256-byte alignment per tensor.
  void EmitMuonBuckets(const std::vector<MuonShard>& shards) {
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
      for (int k = group_base[g]; k < group_base[g + 1]; ++k) {
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

  void EmitOwnerBuckets(int group, absl::Span<const OwnedShard> owned, v1::RankPlan* owner) {
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
  void EmitAdamwBuckets() {
    const bool balanced = policy_.policy() == v1::BALANCED;
    std::vector<std::vector<int>> buckets_of(layout_.num_groups());
    for (int g = 0; g < layout_.num_groups(); ++g) {
      std::vector<int> units = model_.adamw_units[g];
      if (units.empty()) continue;
      std::stable_sort(units.begin(), units.end(), [&](int a, int b) {
        return DTypeNameLess(model_.tensors[model_.units[a].tensor].dtype,
                             model_.tensors[model_.units[b].tensor].dtype);
      });
      std::vector<v1::DType> dtypes;
      std::vector<int64_t> numels;
      for (int u : units) {
        dtypes.push_back(model_.tensors[model_.units[u].tensor].dtype);
        numels.push_back(model_.units[u].numel);
      }
      for (const std::vector<int>& members : AssignGroupBySize(dtypes, numels, limit_bytes())) {
        std::vector<int> bucket_units;
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

  int EmitAdamwLayout(int group, const std::vector<int>& units, bool balanced) {
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
  void WaterFillAdamw(const std::vector<std::vector<int>>& buckets_of) {
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
  void EmitSlices(const v1::AdamwBucket& b) {
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

  ParamCounts CountParams() const {
    ParamCounts c;
    for (const ResolvedTensor& t : model_.tensors) c.Add(t.numel, t.muon);
    return c;
  }

  int64_t MaxMatrixStateBytes() const {
    int64_t best = 0;
    for (const ResolvedTensor& t : model_.tensors) {
      if (t.muon) best = std::max(best, t.rows * t.cols * MuonStateBytesPerElem(t.dtype));
    }
    return best;
  }

  double MaxMatrixFlops() const {
    double best = 0;
    for (const ResolvedTensor& t : model_.tensors) {
      if (t.muon) best = std::max(best, NsFlops(t.ns_rows, t.ns_cols, policy_.ns_steps()));
    }
    return best;
  }

  const v1::ModelManifest& manifest_;
  const v1::PlanPolicy& policy_;
  const RankLayout& layout_;
  ResolvedModel model_;
  const v1::Plan* previous_;  // sticky re-planning; may be null
  const Preload* preload_ = nullptr;
  const std::vector<MuonShard>* fixed_muon_ = nullptr;
  int dense_runs_ = 1;
  bool memory_only_ = false;
  std::vector<MuonShard> muon_shards_;
  v1::Plan* plan_ = nullptr;  // under construction; owned until Build returns
  // Per rank: the sums over its owned tensors and slices, kept as they are
  // emitted (in the order ComputeRankTotals would add them).
  std::vector<RankTotals> totals_;
};

}  // namespace

namespace {

// One part of a tp plan (tensor_parallel.h): its resolved model, planned by
// the builder. Empty (a plan with the part's ranks only) without tensors.
class PartPlanner {
 public:
  static absl::StatusOr<PartPlanner> Create(TpReplica part, const ResolvedModel& whole, const std::vector<int>& tensors,
                                            const std::vector<std::string>& patterns) {
    MUONSHARD_ASSIGN_OR_RETURN(RankLayout layout, RankLayout::Create(part.topology));
    PartPlanner p(std::move(part), layout);
    if (tensors.empty()) return p;
    MUONSHARD_ASSIGN_OR_RETURN(p.model_, ResolveModel(p.part_.manifest, p.layout_, patterns));
    UseWholeMatricesForNs(whole, tensors, p.model_);
    p.empty_ = false;
    return p;
  }

  // `preload` and `fixed_muon` as PlanBuilder's (may be null); keeps the
  // Muon assignment for a later Plan with it fixed.
  absl::StatusOr<std::unique_ptr<v1::Plan>> Plan(const v1::PlanPolicy& policy, const std::string& hash,
                                                 const Preload* preload, const std::vector<MuonShard>* fixed_muon,
                                                 int dense_runs = 1) {
    if (empty_) {
      auto plan = std::make_unique<v1::Plan>();
      *plan->mutable_policy() = policy;
      for (int r = 0; r < layout_.world_size(); ++r) plan->add_ranks()->set_rank(r);
      return plan;
    }
    PlanBuilder builder(part_.manifest, policy, layout_, model_, previous_);
    builder.set_preload(preload);
    builder.set_fixed_muon(fixed_muon);
    builder.set_dense_runs(dense_runs);
    MUONSHARD_ASSIGN_OR_RETURN(v1::Plan * plan, builder.Build(hash, nullptr));
    muon_shards_ = builder.muon_shards();
    return std::unique_ptr<v1::Plan>(plan);
  }

  const std::vector<MuonShard>& muon_shards() const { return muon_shards_; }
  // Sticky re-planning: the previous plan, numbered as this part's layout
  // numbers ranks (must outlive the Plan calls); null for none.
  void set_previous(const v1::Plan* previous) { previous_ = previous; }

 private:
  PartPlanner(TpReplica part, const RankLayout& layout) : part_(std::move(part)), layout_(layout) {}

  TpReplica part_;
  RankLayout layout_;
  ResolvedModel model_;
  bool empty_ = true;
  const v1::Plan* previous_ = nullptr;
  std::vector<MuonShard> muon_shards_;
};

// The layout's resolved topology with the canonical device capacities.
absl::StatusOr<v1::Topology> ResolvedTopology(const RankLayout& layout, const v1::Topology& given) {
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<int64_t> capacities, CanonicalCapacities(given, layout.world_size()));
  v1::Topology t = layout.Resolved();
  t.mutable_device_memory_bytes()->Add(capacities.begin(), capacities.end());
  return t;
}

// Per-rank capacities as preloaded optimizer state: the balanced policy and
// the AdamW water-filling level state + (largest capacity - own capacity),
// i.e. they level headroom. Zeros when every rank has the same capacity.
Preload CapacityDeficit(const std::vector<int64_t>& capacities, int world_size) {
  Preload p;
  p.ns_flops.assign(world_size, 0);
  p.state_bytes.assign(world_size, 0);
  if (capacities.size() < 2) return p;
  const int64_t largest = *std::max_element(capacities.begin(), capacities.end());
  for (int r = 0; r < world_size; ++r) p.state_bytes[r] = largest - capacities[r];
  return p;
}

// A computed plan with the request's capacities, its memory filled in, and
// refused (and freed, when not on an arena) when a rank does not fit.
absl::StatusOr<v1::Plan*> Fitted(absl::StatusOr<v1::Plan*> plan, const v1::Topology& topology) {
  if (!plan.ok()) return plan;
  *(*plan)->mutable_topology()->mutable_device_memory_bytes() = topology.device_memory_bytes();
  AddMemory(**plan);
  absl::Status fit = CheckFit(**plan);
  if (fit.ok()) return plan;
  if ((*plan)->GetArena() == nullptr) delete *plan;
  return fit;
}

// One way of planning the experts around the dense part (`adamw`, see
// RankPreload) and, balanced, the dense AdamW again around them.
struct TpExperts {
  std::unique_ptr<v1::Plan> dense;
  std::unique_ptr<v1::Plan> experts;
};

absl::StatusOr<TpExperts> PlanExpertsAround(const v1::PlanPolicy& policy, const std::string& hash,
                                            const v1::ModelManifest& manifest, const RankLayout& layout,
                                            const TpParts& dense_only_parts, PartPlanner& dense_planner,
                                            PartPlanner& expert_planner, AdamwPreload adamw) {
  v1::Plan dense_only;
  ExpandTensorParallel(dense_only_parts, manifest, layout, &dense_only);
  const Preload dense_load = RankPreload(dense_only, adamw);
  TpExperts out;
  MUONSHARD_ASSIGN_OR_RETURN(out.experts, expert_planner.Plan(policy, hash, &dense_load, nullptr));
  if (policy.policy() == v1::BALANCED) {
    const Preload expert_load = ReplicaPreload(*out.experts, layout.tp());
    const std::vector<MuonShard> placed = dense_planner.muon_shards();
    MUONSHARD_ASSIGN_OR_RETURN(out.dense, dense_planner.Plan(policy, hash, &expert_load, &placed));
  }
  return out;
}

// The balanced policy plans the parts of a tp plan more than one way and
// keeps one merged plan: the lowest max(bytes, FLOPs) over LB (ties to the
// first tried), or, sticky, the one that moves the fewest state bytes from
// the previous plan among those within kStickyScoreSlack of the lowest.
class TpChoice {
 public:
  TpChoice(const v1::ModelManifest& manifest, const RankLayout& layout, const v1::Plan* previous)
      : manifest_(manifest), layout_(layout), previous_(previous) {}

  // Scores the merged plan of `parts`.
  void Add(const TpParts& parts) {
    v1::Plan merged;
    ExpandTensorParallel(parts, manifest_, layout_, &merged);
    Merit m{std::max(merged.stats().max_over_lb_state_bytes(), merged.stats().max_over_lb_ns_flops()), 0};
    if (previous_ != nullptr) {
      // A previous plan of another model (tensors missing or resized) is
      // sticky where names match, but its transfers are not comparable.
      absl::StatusOr<TransferSummary> moved = ComputeTransfers(*previous_, merged);
      comparable_ = comparable_ && moved.ok();
      if (moved.ok()) m.moved_bytes = moved->moved_bytes;
    }
    merits_.push_back(m);
  }

  // The index of the plan to keep (0 when none was scored).
  int Best() const {
    double lowest = INFINITY;
    for (const Merit& m : merits_) lowest = std::min(lowest, m.score);
    const double limit = previous_ != nullptr && comparable_ ? lowest * kStickyScoreSlack : lowest;
    int best = 0;
    for (int k = 0; k < static_cast<int>(merits_.size()); ++k) {
      const Merit& m = merits_[k];
      if (m.score <= limit && (merits_[best].score > limit || m.moved_bytes < merits_[best].moved_bytes)) best = k;
    }
    return best;
  }

 private:
  static constexpr double kStickyScoreSlack = 1.02;  // the balanced policy's own sticky slack
  struct Merit {
    double score;
    int64_t moved_bytes;
  };
  const v1::ModelManifest& manifest_;
  const RankLayout& layout_;
  const v1::Plan* previous_;
  bool comparable_ = true;
  std::vector<Merit> merits_;
};

// The ways the dense matrices are placed: one by one, and balanced also in
// runs of tp (BalancedOptions.dense_runs).
std::vector<int> DenseRuns(const v1::PlanPolicy& policy, const RankLayout& layout) {
  if (policy.policy() != v1::BALANCED) return {1};
  return {1, layout.tp()};
}

// The previous plan of a sticky re-plan as the replica layout numbers its
// ranks: a matrix rank r owned (whole or a shard of) is the replica r / tp
// owns; ranks past the world stay past it. Tensors and owners only.
v1::Plan ReplicaNumbered(const v1::Plan& previous, int tp) {
  v1::Plan out;
  out.set_content_hash(previous.content_hash());
  *out.mutable_tensors() = previous.tensors();
  for (const v1::RankPlan& r : previous.ranks()) {
    v1::RankPlan* q = out.add_ranks();
    q->set_rank(r.rank() / tp);
    *q->mutable_owned() = r.owned();
  }
  return out;
}

// The dense part without experts of its own (ep 1, or none in the model):
// the DenseRuns plan TpChoice keeps.
absl::StatusOr<std::unique_ptr<v1::Plan>> PlanDenseAlone(const v1::PlanPolicy& policy, const std::string& hash,
                                                         const v1::ModelManifest& manifest, const RankLayout& layout,
                                                         const TpParts& parts, PartPlanner& dense_planner,
                                                         const v1::Plan* previous) {
  const std::vector<int> runs = DenseRuns(policy, layout);
  std::vector<std::unique_ptr<v1::Plan>> tried;
  TpChoice choice(manifest, layout, previous);
  for (int r : runs) {
    MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<v1::Plan> dense, dense_planner.Plan(policy, hash, nullptr, nullptr, r));
    if (runs.size() > 1) choice.Add(TpParts{dense.get(), parts.dense_index, nullptr, parts.expert_index});
    tried.push_back(std::move(dense));
  }
  return std::move(tried[choice.Best()]);
}

// The dense part and the experts around it. The balanced policy tries every
// DenseRuns placement with both ways of counting the dense AdamW
// (AdamwPreload), and keeps the merged plan TpChoice keeps.
absl::StatusOr<TpExperts> PlanDenseAndExperts(const v1::PlanPolicy& policy, const std::string& hash,
                                              const v1::ModelManifest& manifest, const RankLayout& layout,
                                              TpParts parts, PartPlanner& dense_planner, PartPlanner& expert_planner,
                                              const v1::Plan* previous) {
  const bool balanced = policy.policy() == v1::BALANCED;
  std::vector<TpExperts> tried;
  TpChoice choice(manifest, layout, previous);
  for (int runs : DenseRuns(policy, layout)) {
    MUONSHARD_ASSIGN_OR_RETURN(std::unique_ptr<v1::Plan> dense,
                               dense_planner.Plan(policy, hash, nullptr, nullptr, runs));
    parts.dense = dense.get();
    for (AdamwPreload adamw : {AdamwPreload::kStageMean, AdamwPreload::kWater}) {
      if (!balanced && adamw == AdamwPreload::kWater) break;
      MUONSHARD_ASSIGN_OR_RETURN(
          TpExperts t, PlanExpertsAround(policy, hash, manifest, layout, parts, dense_planner, expert_planner, adamw));
      if (t.dense == nullptr) t.dense = std::move(dense);  // seed: the dense part as planned
      if (balanced) choice.Add(TpParts{t.dense.get(), parts.dense_index, t.experts.get(), parts.expert_index});
      tried.push_back(std::move(t));
    }
  }
  return std::move(tried[choice.Best()]);
}

// tensor_parallel.h: the replica's plan, expanded over the tp ranks, and
// with ep > 1 the experts' plan on the whole layout merged in. The dense
// matrices are placed first (coarse items); the experts (many equal ones)
// fill in around their load on every rank; the dense AdamW shards are then
// water-filled around both (the same on every tp rank of a replica).
absl::StatusOr<v1::Plan*> PlanTensorParallel(const v1::ModelManifest& manifest, const v1::PlanPolicy& policy,
                                             const RankLayout& layout, const ResolvedModel& whole,
                                             const std::vector<std::string>& patterns, std::string hash,
                                             google::protobuf::Arena* arena, const v1::Plan* previous) {
  TpParts parts;
  SplitDenseAndExperts(whole, layout, &parts.dense_index, &parts.expert_index);
  MUONSHARD_ASSIGN_OR_RETURN(
      PartPlanner dense_planner,
      PartPlanner::Create(ReplicaOf(manifest, layout, parts.dense_index, whole), whole, parts.dense_index, patterns));
  // Sticky: the dense part keeps each matrix on the replica of the rank that
  // owned it, the experts (planned on the whole layout) on that rank.
  v1::Plan replica_previous;
  if (previous != nullptr) {
    replica_previous = ReplicaNumbered(*previous, layout.tp());
    dense_planner.set_previous(&replica_previous);
  }
  TpExperts kept;
  if (parts.expert_index.empty()) {
    MUONSHARD_ASSIGN_OR_RETURN(kept.dense,
                               PlanDenseAlone(policy, hash, manifest, layout, parts, dense_planner, previous));
  } else {
    MUONSHARD_ASSIGN_OR_RETURN(PartPlanner expert_planner,
                               PartPlanner::Create(ExpertsOf(manifest, layout, parts.expert_index, whole), whole,
                                                   parts.expert_index, patterns));
    expert_planner.set_previous(previous);
    MUONSHARD_ASSIGN_OR_RETURN(
        kept, PlanDenseAndExperts(policy, hash, manifest, layout, parts, dense_planner, expert_planner, previous));
    parts.experts = kept.experts.get();
  }
  parts.dense = kept.dense.get();
  v1::Plan* plan = google::protobuf::Arena::CreateMessage<v1::Plan>(arena);
  ExpandTensorParallel(parts, manifest, layout, plan);
  plan->set_content_hash(std::move(hash));
  plan->set_format_version(kPlanFormatVersion);
  return plan;
}

}  // namespace

absl::StatusOr<v1::PlanRequest> CanonicalizeRequest(const v1::PlanRequest& request) {
  v1::PlanRequest out;
  MUONSHARD_ASSIGN_OR_RETURN(RankLayout layout, RankLayout::Create(request.topology()));
  MUONSHARD_ASSIGN_OR_RETURN(*out.mutable_policy(), CanonicalPolicy(request.policy(), layout.tp()));
  MUONSHARD_ASSIGN_OR_RETURN(*out.mutable_topology(), ResolvedTopology(layout, request.topology()));
  *out.mutable_manifest() = request.manifest();
  return out;
}

std::string ContentHash(const v1::PlanRequest& canonical) {
  return HashRequestParts(canonical.manifest(), canonical.topology(), canonical.policy());
}

absl::StatusOr<v1::Plan*> ComputePlan(const v1::PlanRequest& request, google::protobuf::Arena* arena) {
  return ComputePlan(request, arena, nullptr);
}

absl::StatusOr<v1::Plan*> ComputePlan(const v1::PlanRequest& request, google::protobuf::Arena* arena,
                                      const v1::Plan* previous) {
  // The manifest is used in place (it can hold ~100k tensors); only the
  // topology and policy are canonicalized.
  MUONSHARD_ASSIGN_OR_RETURN(RankLayout layout, RankLayout::Create(request.topology()));
  MUONSHARD_ASSIGN_OR_RETURN(v1::PlanPolicy policy, CanonicalPolicy(request.policy(), layout.tp()));
  if (previous != nullptr && previous->content_hash() != policy.sticky_to()) {
    return absl::InvalidArgumentError(absl::StrCat("policy.sticky_to: \"", policy.sticky_to(),
                                                   "\" does not name the previous plan (", previous->content_hash(),
                                                   ")"));
  }
  if (previous == nullptr && !policy.sticky_to().empty()) {
    return absl::InvalidArgumentError("policy.sticky_to: the previous plan was not supplied");
  }
  MUONSHARD_ASSIGN_OR_RETURN(const v1::Topology topology, ResolvedTopology(layout, request.topology()));
  std::vector<std::string> patterns(policy.muon_exclude_patterns().begin(), policy.muon_exclude_patterns().end());
  MUONSHARD_ASSIGN_OR_RETURN(ResolvedModel model, ResolveModel(request.manifest(), layout, patterns));
  const std::string hash = HashRequestParts(request.manifest(), topology, policy);
  if (layout.tp() > 1) {
    return Fitted(PlanTensorParallel(request.manifest(), policy, layout, model, patterns, hash, arena, previous),
                  topology);
  }
  const std::vector<int64_t> capacities(topology.device_memory_bytes().begin(), topology.device_memory_bytes().end());
  const Preload deficit = CapacityDeficit(capacities, layout.world_size());
  auto build = [&](ResolvedModel resolved, bool memory_only) {
    PlanBuilder builder(request.manifest(), policy, layout, std::move(resolved), previous);
    if (capacities.size() > 1) builder.set_preload(&deficit);
    builder.set_memory_only(memory_only);
    return Fitted(builder.Build(hash, arena), topology);
  };
  // The balanced plan trades memory for FLOPs; when it does not fit, the
  // plan that levels memory alone is the best chance to.
  const bool may_retry = policy.policy() == v1::BALANCED && previous == nullptr && !capacities.empty();
  if (!may_retry) return build(std::move(model), false);
  absl::StatusOr<v1::Plan*> plan = build(model, false);
  if (!IsFitError(plan.status())) return plan;
  plan = build(std::move(model), true);
  if (!IsFitError(plan.status())) return plan;
  return absl::InvalidArgumentError(
      absl::StrCat(plan.status().message(), " (no plan fits: the balanced policy levelling memory alone)"));
}

namespace {

// Fits: true; does not fit: false; any other error: that error.
absl::StatusOr<bool> FitsAt(v1::PlanRequest& request, int world_size) {
  request.mutable_topology()->set_world_size(world_size);
  google::protobuf::Arena arena(PlanArenaOptions());
  absl::StatusOr<v1::Plan*> plan = ComputePlan(request, &arena);
  if (plan.ok()) return true;
  if (IsFitError(plan.status())) return false;
  return plan.status();
}

// The model copy and gradient buffers of a rank do not shrink with more
// data ranks: when they alone overflow, say so.
absl::Status CheckFixedTermsFit(const v1::PlanRequest& request) {
  v1::PlanRequest unchecked = request;
  unchecked.mutable_topology()->clear_device_memory_bytes();
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan plan, ComputePlan(unchecked));
  const int64_t capacity = request.topology().device_memory_bytes(0);
  for (const v1::RankPlan& r : plan.ranks()) {
    const int64_t fixed = r.memory().model_bytes() + r.memory().grad_bytes();
    if (fixed <= capacity) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "no world size fits: rank ", r.rank(), "'s model copy and gradient buffers alone need ", FormatBytes(fixed),
        " of its ", FormatBytes(capacity), "; more data ranks do not shrink them: raise pp, ep or tp"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> MinWorldSizeThatFits(const v1::PlanRequest& request, int max_world_size) {
  MUONSHARD_ASSIGN_OR_RETURN(RankLayout layout, RankLayout::Create(request.topology()));
  MUONSHARD_ASSIGN_OR_RETURN(std::vector<int64_t> capacities,
                             CanonicalCapacities(request.topology(), layout.world_size()));
  if (capacities.empty()) {
    return absl::InvalidArgumentError("topology.device_memory_bytes: no capacity to fit the plan into");
  }
  v1::PlanRequest probe = request;
  probe.mutable_topology()->clear_device_memory_bytes();
  probe.mutable_topology()->add_device_memory_bytes(*std::min_element(capacities.begin(), capacities.end()));
  MUONSHARD_RETURN_IF_ERROR(CheckFixedTermsFit(probe));
  const int step = layout.pp() * std::lcm(layout.ep(), layout.tp());
  int miss = layout.world_size() - step, hit = layout.world_size();  // invariant: miss does not fit
  for (;; miss = hit, hit *= 2) {
    if (hit > max_world_size) {
      return absl::FailedPreconditionError(
          absl::StrCat("no world size up to ", max_world_size, " fits ", FormatBytes(capacities[0]), " per rank"));
    }
    MUONSHARD_ASSIGN_OR_RETURN(bool fits, FitsAt(probe, hit));
    if (fits) break;
  }
  while (hit - miss > step) {
    const int mid = miss + (hit - miss) / (2 * step) * step;
    MUONSHARD_ASSIGN_OR_RETURN(bool fits, FitsAt(probe, mid));
    (fits ? hit : miss) = mid;
  }
  return hit;
}

google::protobuf::ArenaOptions PlanArenaOptions() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = 64 << 10;
  options.max_block_size = 16 << 20;
  return options;
}

absl::StatusOr<std::shared_ptr<const v1::Plan>> ComputeSharedPlan(const v1::PlanRequest& request) {
  auto arena = std::make_shared<google::protobuf::Arena>(PlanArenaOptions());
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan * plan, ComputePlan(request, arena.get()));
  return std::shared_ptr<const v1::Plan>(std::move(arena), plan);  // aliasing: shares the arena's count
}

absl::StatusOr<v1::Plan> ComputePlan(const v1::PlanRequest& request) {
  MUONSHARD_ASSIGN_OR_RETURN(v1::Plan * plan, ComputePlan(request, nullptr));
  std::unique_ptr<v1::Plan> owned(plan);
  return std::move(*owned);
}

}  // namespace muonshard::planner
