#include "plan/memory.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "plan/model.h"
#include "plan/muon_rounds.h"
#include "plan/plan_stats.h"
#include "plan/tp_rounds.h"

namespace muonshard::planner {
namespace {

// Optimizer state, staging and NS workspace are fp32 (the one dtype-size table: DTypeSize).
int64_t Fp32Bytes() { return DTypeSize(v1::FP32); }

// Model-copy and gradient bytes every rank of a group holds: the group's
// buckets, padding included.
struct GroupBuffers {
  int64_t model = 0;
  int64_t grad = 0;
};

std::vector<GroupBuffers> BuffersPerGroup(const v1::Plan& plan) {
  const int grad_size = DTypeSize(plan.policy().grad_dtype());
  std::vector<GroupBuffers> out(plan.groups_size());
  // NOTE [Muon scatter rounds]: a round's buckets lie in one buffer of a
  // segment (its largest bucket) per member, and the reduced segment has one
  // of its own (internal::GradientBuffers, ParameterBuffers).
  std::vector<bool> in_round;
  for (const ScatterRoundSize& r : ScatterRoundSizes(plan, &in_round)) {
    const int64_t members = plan.groups(r.group).ranks_size();
    out[r.group].model += members * r.segment * DTypeSize(r.dtype);
    out[r.group].grad += (members + 1) * r.segment * grad_size;
  }
  for (int i = 0; i < plan.muon_buckets_size(); ++i) {
    const v1::MuonBucket& b = plan.muon_buckets(i);
    if (in_round[i]) continue;
    out[b.group()].model += b.numel() * DTypeSize(b.dtype());
    out[b.group()].grad += b.numel() * grad_size;
  }
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    out[b.group()].model += b.numel() * DTypeSize(b.dtype());
    out[b.group()].grad += b.numel() * grad_size;
  }
  return out;
}

// The rank orthogonalises this owned matrix itself (all of it).
bool RunsNs(const v1::OwnedTensor& o, int tp_rank) {
  return o.tp_op() == v1::TP_OP_NONE || o.ns_tp_rank() < 0 || o.ns_tp_rank() == tp_rank;
}

// What the memory terms read of each tensor, gathered in one pass in tensor
// order: the owned lists then index these few bytes per tensor instead of
// the tensors themselves, which a plan of ~100k tensors scatters over far
// more memory than the caches hold (this was ~8 % of plan time).
struct TensorTerms {
  // NsWorkspaceBytes of the whole matrix (0 below two dimensions).
  int64_t ns_workspace = 0;
  int64_t master_bytes_per_elem = 0;
};

std::vector<TensorTerms> TermsPerTensor(const v1::Plan& plan) {
  std::vector<TensorTerms> out(plan.tensors_size());
  for (int i = 0; i < plan.tensors_size(); ++i) {
    const v1::PlannedTensor& t = plan.tensors(i);
    const int n = t.shape_size();
    if (n >= 2) out[i].ns_workspace = NsWorkspaceBytes(t.shape(n - 2), t.shape(n - 1));
    out[i].master_bytes_per_elem = MasterBytesPerElem(t.dtype());
  }
  return out;
}

// Per-block Newton-Schulz (NsBlocks) is charged the workspace of the whole
// matrix it runs on (its blocks go through batched calls); with TP_OP_LOCAL
// that matrix is the rank's own shard.
int64_t LargestNsWorkspace(const v1::Plan& plan, const v1::RankPlan& r, const std::vector<TensorTerms>& terms) {
  int64_t largest = 0;
  for (const v1::OwnedTensor& o : r.owned()) {
    if (!RunsNs(o, r.tp_rank()) || o.tensor() < 0 || o.tensor() >= plan.tensors_size()) continue;
    if (o.tp_op() == v1::TP_OP_SHARDED_NS) continue;  // its Gram matrices are in TpStagingBytes
    if (o.tp_op() != v1::TP_OP_LOCAL) {
      largest = std::max(largest, terms[o.tensor()].ns_workspace);
      continue;
    }
    const auto& shape = HeldShape(plan.tensors(o.tensor()));
    const int n = shape.size();
    if (n >= 2) largest = std::max(largest, NsWorkspaceBytes(shape[n - 2], shape[n - 1]));
  }
  return largest;
}

// With tp > 1 (internal::TpMuonExchange::AllocateScratch): per exchange
// round (NOTE [TP exchange rounds] in tp_rounds.h), the fp32 updates of the
// rank's TP-split shards, and for each batch it orthogonalises (one per NS
// tp rank) tp x the batch's shards twice, for the gathered inputs and the
// whole matrices; for a shard orthogonalised in place (TP_OP_SHARDED_NS), its
// Gram and polynomial matrices and the next iterate instead. The buffers
// are sized by the largest round.
int64_t TpStagingBytes(const v1::Plan& plan, const v1::RankPlan& r) {
  const int64_t tp = std::max(1, plan.topology().tp());
  std::map<int, int64_t> update;   // muon bucket id -> exchanged shard elements
  std::map<int, int64_t> scratch;  // muon bucket id -> tp x elements this rank orthogonalises
  std::map<int, int64_t> sharded;  // muon bucket id -> sharded NS work floats
  for (const v1::OwnedTensor& o : r.owned()) {
    if (o.tp_op() == v1::TP_OP_NONE || o.tp_op() == v1::TP_OP_LOCAL) continue;  // nothing exchanged
    update[o.bucket()] += o.numel();
    if (o.tp_op() == v1::TP_OP_SHARDED_NS) {
      const std::optional<ShardedNs> ns = ShardedNsOf(plan.tensors(o.tensor()));
      const int64_t m = ns.has_value() ? ns->m : 0;
      sharded[o.bucket()] += 2 * (o.matrix_end() - o.matrix_begin()) * m * m + o.numel();
    } else if (RunsNs(o, r.tp_rank())) {
      scratch[o.bucket()] += tp * o.numel();
    }
  }
  int64_t max_update = 0, max_scratch = 0, max_sharded = 0;
  for (const std::vector<int>& round : TpExchangeRoundsOf(plan, r)) {
    int64_t round_update = 0, round_scratch = 0, round_sharded = 0;
    for (int b : round) {
      const int id = plan.muon_buckets(b).id();
      round_update += update[id];
      round_scratch += scratch[id];
      round_sharded += sharded[id];
    }
    max_update = std::max(max_update, round_update);
    max_scratch = std::max(max_scratch, round_scratch);
    max_sharded = std::max(max_sharded, round_sharded);
  }
  return Fp32Bytes() * (max_update + 2 * max_scratch + max_sharded);
}

// Per rank: the bytes of its fp32 masters, which only BF16/FP16 parameters
// have (MasterBytesPerElem): of its owned Muon tensors and of its shards of
// the AdamW buckets.
std::vector<int64_t> MasterBytesPerRank(const v1::Plan& plan, const std::vector<TensorTerms>& terms) {
  std::vector<int64_t> out(plan.ranks_size(), 0);
  for (const v1::RankPlan& r : plan.ranks()) {
    if (r.rank() < 0 || r.rank() >= plan.ranks_size()) continue;
    for (const v1::OwnedTensor& o : r.owned()) {
      if (o.tensor() < 0 || o.tensor() >= plan.tensors_size()) continue;
      out[r.rank()] += o.numel() * terms[o.tensor()].master_bytes_per_elem;
    }
  }
  for (const v1::AdamwBucket& b : plan.adamw_buckets()) {
    const int64_t per_elem = MasterBytesPerElem(b.dtype());
    if (per_elem == 0 || b.group() < 0 || b.group() >= plan.groups_size()) continue;
    const v1::CommGroup& g = plan.groups(b.group());
    for (int i = 0; i < g.ranks_size() && i + 1 < b.shard_offsets_size(); ++i) {
      const int rank = g.ranks(i);
      if (rank < 0 || rank >= plan.ranks_size()) continue;
      out[rank] += (b.shard_offsets(i + 1) - b.shard_offsets(i)) * per_elem;
    }
  }
  return out;
}

v1::RankMemory MemoryOf(const v1::Plan& plan, const v1::RankPlan& r, const std::vector<TensorTerms>& terms,
                        const GroupBuffers& held, int64_t master_bytes, int64_t capacity) {
  v1::RankMemory m;
  m.set_model_bytes(held.model);
  m.set_grad_bytes(held.grad);
  m.set_master_bytes(master_bytes);
  m.set_muon_momentum_bytes(Fp32Bytes() * r.muon_numel());
  m.set_adamw_moment_bytes(2 * Fp32Bytes() * r.adamw_shard_numel());
  m.set_comm_buffer_bytes(TpStagingBytes(plan, r));
  m.set_ns_workspace_bytes(LargestNsWorkspace(plan, r, terms));
  int64_t total = 0;
  for (const MemoryTerm& term : MemoryTerms()) total += (m.*term.get)();
  m.set_total_bytes(total);
  if (capacity > 0) {
    m.set_capacity_bytes(capacity);
    m.set_headroom_bytes(capacity - total);
  }
  return m;
}

}  // namespace

const std::vector<MemoryTerm>& MemoryTerms() {
  static const auto* terms = new std::vector<MemoryTerm>{
      {"model", &v1::RankMemory::model_bytes},
      {"grad", &v1::RankMemory::grad_bytes},
      {"master", &v1::RankMemory::master_bytes},
      {"muon_momentum", &v1::RankMemory::muon_momentum_bytes},
      {"adamw_moment", &v1::RankMemory::adamw_moment_bytes},
      {"comm_buffer", &v1::RankMemory::comm_buffer_bytes},
      {"ns_workspace", &v1::RankMemory::ns_workspace_bytes},
  };
  return *terms;
}

int64_t NsWorkspaceBytes(int64_t rows, int64_t cols) {
  const int64_t small = std::min(rows, cols);
  return Fp32Bytes() * (3 * rows * cols + 2 * small * small);
}

int64_t CapacityOf(const std::vector<int64_t>& capacities, int rank) {
  if (capacities.size() == 1) return capacities[0];
  return rank >= 0 && rank < static_cast<int>(capacities.size()) ? capacities[rank] : 0;
}

std::vector<v1::RankMemory> ComputeRankMemory(const v1::Plan& plan) {
  const std::vector<GroupBuffers> per_group = BuffersPerGroup(plan);
  std::vector<GroupBuffers> per_rank(plan.ranks_size());
  for (int g = 0; g < plan.groups_size(); ++g) {
    for (int rank : plan.groups(g).ranks()) {
      if (rank < 0 || rank >= plan.ranks_size()) continue;
      per_rank[rank].model += per_group[g].model;
      per_rank[rank].grad += per_group[g].grad;
    }
  }
  const std::vector<int64_t> capacities(plan.topology().device_memory_bytes().begin(),
                                        plan.topology().device_memory_bytes().end());
  const std::vector<TensorTerms> terms = TermsPerTensor(plan);
  const std::vector<int64_t> masters = MasterBytesPerRank(plan, terms);
  std::vector<v1::RankMemory> out;
  out.reserve(plan.ranks_size());
  for (int i = 0; i < plan.ranks_size(); ++i) {
    out.push_back(MemoryOf(plan, plan.ranks(i), terms, per_rank[i], masters[i], CapacityOf(capacities, i)));
  }
  return out;
}

void AddMemory(v1::Plan& plan) {
  std::vector<v1::RankMemory> memory = ComputeRankMemory(plan);
  v1::PlanStats& s = *plan.mutable_stats();
  double sum = 0;
  for (int i = 0; i < plan.ranks_size(); ++i) {
    const v1::RankMemory& m = memory[i];
    sum += static_cast<double>(m.total_bytes());
    if (i == 0 || m.total_bytes() > s.max_memory_bytes()) {
      s.set_max_memory_bytes(m.total_bytes());
      s.set_max_memory_rank(i);
    }
    if (m.capacity_bytes() > 0 && (i == 0 || m.headroom_bytes() < s.min_headroom_bytes())) {
      s.set_min_headroom_bytes(m.headroom_bytes());
    }
    *plan.mutable_ranks(i)->mutable_memory() = std::move(memory[i]);
  }
  s.set_mean_memory_bytes(plan.ranks_size() > 0 ? sum / plan.ranks_size() : 0);
}

}  // namespace muonshard::planner
