#include "sim/peer_programs.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "plan/model.h"
#include "plan/ns_blocks.h"
#include "sim/plan_program.h"

namespace muonshard::sim {

namespace {

constexpr int64_t kFp32 = 4;
constexpr int64_t kBf16 = 2;
constexpr int64_t kMiB = int64_t{1} << 20;

struct Named {
  PeerStrategy strategy;
  const char* name;
};
constexpr Named kNames[] = {
    {PeerStrategy::kMegatronDuplicated, "megatron-duplicated"},
    {PeerStrategy::kMegatronDistributed, "megatron-distributed"},
    {PeerStrategy::kMegatronBlockwise, "megatron-blockwise"},
    {PeerStrategy::kMegatronLayerSharded, "megatron-layer-sharded"},
    {PeerStrategy::kRoundRobinAllGather, "kj-round-robin"},
    {PeerStrategy::kAllToAll, "dion-all-to-all"},
    {PeerStrategy::kZero1, "zero1-muon"},
};

// One Muon matrix as the ranks of its data-parallel group hold it.
struct Matrix {
  int tensor = 0;
  int64_t rows = 0, cols = 0;  // held: the TP shard with tp > 1
  int64_t numel = 0;           // rows x cols
  v1::DType dtype = v1::BF16;
  bool tp_split = false;
  NsMatrix full;           // Newton-Schulz of the whole matrix
  NsMatrix shard;          // of the held shard alone (blockwise)
  int64_t gram_bytes = 0;  // the whole matrix's fp32 Gram (min_dim^2)
};

// An AdamW tensor (part) as the ranks of its group hold it.
struct Chunk {
  int tensor = 0;
  int64_t numel = 0;
  v1::DType dtype = v1::BF16;
};

// A data-parallel group (DEFAULT or MOE_EXPERT) and what it holds, in model
// order.
struct DpGroup {
  int group = 0;  // index into Job::groups
  std::vector<Matrix> muon;
  std::vector<Chunk> adamw;
};

struct Job {
  int world_size = 0;
  v1::DType grad = v1::FP32;
  int ns_steps = 5;
  int64_t bucket_bytes = 256 * kMiB;
  std::vector<std::vector<int>> groups;
  std::vector<DpGroup> dp;
  std::vector<int> tp_group;  // per rank: its TENSOR_PARALLEL group, or -1
};

int64_t Size(v1::DType dtype) { return planner::DTypeSize(dtype); }

int64_t GradBytes(const Job& job, const DpGroup& d) {
  int64_t n = 0;
  for (const Matrix& m : d.muon) n += m.numel;
  for (const Chunk& c : d.adamw) n += c.numel;
  return n * Size(job.grad);
}

int64_t ParamBytes(const DpGroup& d) {
  int64_t b = 0;
  for (const Matrix& m : d.muon) b += m.numel * Size(m.dtype);
  for (const Chunk& c : d.adamw) b += c.numel * Size(c.dtype);
  return b;
}

Matrix MatrixOf(const v1::PlannedTensor& t, int steps) {
  const int n = t.shape_size();
  const int64_t rows = t.shape(n - 2), cols = t.shape(n - 1);
  const auto& held = planner::HeldShape(t);
  const int64_t held_rows = held.size() >= 2 ? held[held.size() - 2] : rows;
  const int64_t held_cols = held.size() >= 2 ? held[held.size() - 1] : cols;
  Matrix m;
  m.tensor = 0;
  m.rows = held_rows;
  m.cols = held_cols;
  m.numel = held_rows * held_cols;
  m.dtype = t.dtype();
  m.tp_split = held_rows * held_cols != rows * cols;
  const int64_t min_dim = std::max<int64_t>(1, std::min(rows, cols));
  m.full = {planner::BlockedNsFlops(t.has_ns_blocks() ? &t.ns_blocks() : nullptr, rows, cols, steps), min_dim};
  m.shard = {planner::NsFlops(held_rows, held_cols, steps), std::max<int64_t>(1, std::min(held_rows, held_cols))};
  m.gram_bytes = min_dim * min_dim * kFp32;
  return m;
}

absl::Status AddTensor(const v1::PlannedTensor& t, int index, const absl::flat_hash_map<int, int>& group_of_id,
                       int steps, std::vector<int>& dp_of_group, Job& job) {
  const bool muon = t.optimizer() == v1::MUON && t.shape_size() >= 2;
  for (const v1::TensorPart& part : t.parts()) {
    auto it = group_of_id.find(part.group());
    if (it == group_of_id.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: tensor ", t.name(), ": group ", part.group(), " is not in the plan"));
    }
    if (dp_of_group[it->second] < 0) {
      dp_of_group[it->second] = static_cast<int>(job.dp.size());
      job.dp.push_back({it->second, {}, {}});
    }
    DpGroup& d = job.dp[dp_of_group[it->second]];
    const int64_t numel = part.element_end() - part.element_begin();
    if (!muon) {
      d.adamw.push_back({index, numel, t.dtype()});
      continue;
    }
    Matrix m = MatrixOf(t, steps);
    m.tensor = index;
    const int64_t count = t.shape_size() >= 3 && part.matrix_end() > part.matrix_begin()
                              ? part.matrix_end() - part.matrix_begin()
                              : std::max<int64_t>(1, numel / std::max<int64_t>(1, m.numel));
    for (int64_t k = 0; k < count; ++k) d.muon.push_back(m);
  }
  return absl::OkStatus();
}

absl::StatusOr<Job> JobOf(const v1::Plan& plan) {
  Job job;
  job.world_size = plan.topology().world_size() > 0 ? plan.topology().world_size() : plan.ranks_size();
  job.grad = planner::GradDType(plan.policy());
  if (plan.policy().ns_steps() > 0) job.ns_steps = plan.policy().ns_steps();
  if (plan.policy().comm_buffer_mb() > 0) job.bucket_bytes = plan.policy().comm_buffer_mb() * kMiB;
  job.tp_group.assign(job.world_size, -1);
  absl::flat_hash_map<int, int> group_of_id;
  for (int g = 0; g < plan.groups_size(); ++g) {
    const v1::CommGroup& group = plan.groups(g);
    group_of_id[group.id()] = g;
    job.groups.emplace_back(group.ranks().begin(), group.ranks().end());
    for (int r : group.ranks()) {
      if (r < 0 || r >= job.world_size) {
        return absl::InvalidArgumentError(absl::StrCat("plan: group ", group.id(), ": rank ", r, " out of range"));
      }
      if (group.colour() == v1::TENSOR_PARALLEL && group.ranks_size() > 1) job.tp_group[r] = g;
    }
  }
  std::vector<int> dp_of_group(plan.groups_size(), -1);
  for (int t = 0; t < plan.tensors_size(); ++t) {
    MUONSHARD_RETURN_IF_ERROR(AddTensor(plan.tensors(t), t, group_of_id, job.ns_steps, dp_of_group, job));
  }
  std::sort(job.dp.begin(), job.dp.end(), [](const DpGroup& a, const DpGroup& b) { return a.group < b.group; });
  return job;
}

// A program whose collectives run on every member's one in-order lane, as a
// step that waits for each collective: ops are added in one global order,
// so every lane takes them in an order all its groups agree on.
class Sequential {
 public:
  Sequential(const Job& job, std::string name) : job_(job) {
    p_.name = std::move(name);
    p_.world_size = job.world_size;
    p_.groups = job.groups;
    for (int r = 0; r < job.world_size; ++r) lane_.push_back(p_.AddLane({"step", {r}, LaneOrder::kInOrder, {}}));
  }

  // -1 for a group of one rank (it communicates nothing).
  int Collective(OpKind kind, Phase phase, int group, int64_t bytes, const std::string& label) {
    if (job_.groups[group].size() < 2 || bytes <= 0) return -1;
    StepOp op;
    op.kind = kind;
    op.phase = phase;
    op.group = group;
    if (kind == OpKind::kReduce || kind == OpKind::kBroadcast) op.root = 0;
    op.bytes = bytes;
    op.label = label;
    const int i = p_.AddOp(std::move(op));
    for (int m : job_.groups[group]) p_.Append(lane_[m], i, true);
    return i;
  }

  // `total` bytes in collectives of at most the job's bucket size.
  void Bucketed(OpKind kind, Phase phase, int group, int64_t total, const std::string& label) {
    for (int64_t done = 0, k = 0; done < total; ++k) {
      const int64_t b = std::min(job_.bucket_bytes, total - done);
      Collective(kind, phase, group, b, absl::StrCat(label, " ", k));
      done += b;
    }
  }

  void Ns(int rank, std::vector<NsMatrix> matrices, const std::string& label) {
    if (matrices.empty()) return;
    StepOp op;
    op.kind = OpKind::kNewtonSchulz;
    op.phase = Phase::kNewtonSchulz;
    op.rank = rank;
    op.matrices = std::move(matrices);
    op.label = label;
    p_.Append(lane_[rank], p_.AddOp(std::move(op)), true);
  }

  void Elementwise(int rank, Phase phase, int64_t bytes, int calls, const std::string& label) {
    if (bytes <= 0) return;
    StepOp op;
    op.kind = OpKind::kElementwise;
    op.phase = phase;
    op.rank = rank;
    op.memory_bytes = bytes;
    op.calls = calls;
    op.label = label;
    p_.Append(lane_[rank], p_.AddOp(std::move(op)), true);
  }

  StepProgram Take() { return std::move(p_); }

 private:
  const Job& job_;
  StepProgram p_;
  std::vector<int> lane_;
};

int64_t MuonBytes(const Job& job, const Matrix& m) { return m.numel * MuonBytesPerElement(m.dtype, job.grad); }
int64_t AdamwBytes(const Job& job, const Chunk& c) { return c.numel * AdamwBytesPerElement(c.dtype, job.grad); }

// ---- Megatron-LM: LayerWiseDistributedOptimizer + --muon-tp-mode ----------

// What one member of a data-parallel group owns: whole tensors.
struct Owned {
  std::vector<const Matrix*> muon;
  std::vector<const Chunk*> adamw;
};

// Whole tensors to the least-loaded member by elements, largest first, as
// the layer-wise optimizer spreads parameters over the DP ranks.
std::vector<Owned> AssignWhole(const DpGroup& d, int n) {
  struct Item {
    int64_t numel;
    int index;  // < muon.size(): Muon, else AdamW
  };
  std::vector<Item> items;
  for (size_t i = 0; i < d.muon.size(); ++i) items.push_back({d.muon[i].numel, static_cast<int>(i)});
  for (size_t i = 0; i < d.adamw.size(); ++i) {
    items.push_back({d.adamw[i].numel, static_cast<int>(d.muon.size() + i)});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.numel > b.numel; });
  std::vector<Owned> owned(n);
  std::vector<int64_t> load(n, 0);
  for (const Item& it : items) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += it.numel;
    if (it.index < static_cast<int>(d.muon.size())) {
      const Matrix& m = d.muon[it.index];
      owned[r].muon.push_back(&m);
    } else {
      const Chunk& c = d.adamw[it.index - d.muon.size()];
      owned[r].adamw.push_back(&c);
    }
  }
  // Model order within a rank, as the optimizer steps its parameter list.
  for (Owned& o : owned) {
    std::stable_sort(o.muon.begin(), o.muon.end(), [](const Matrix* a, const Matrix* b) { return a < b; });
  }
  return owned;
}

class Megatron {
 public:
  Megatron(const Job& job, PeerStrategy mode) : job_(job), mode_(mode), s_(job, PeerStrategyName(mode)) {}

  absl::StatusOr<StepProgram> Build() {
    // With the layer-wise parameter layout (use_buffer_param_sync) the DDP
    // buffer holds each rank's whole tensors in its shard: gradients are
    // reduce-scattered and parameters all-gathered over it (uneven shares,
    // priced as even, as muonshard's are).
    for (const DpGroup& d : job_.dp) {
      s_.Bucketed(OpKind::kReduceScatter, Phase::kReduce, d.group, GradBytes(job_, d), "reduce_scatter grads");
    }
    owned_.assign(job_.world_size, {});
    for (const DpGroup& d : job_.dp) {
      const std::vector<int>& members = job_.groups[d.group];
      std::vector<Owned> o = AssignWhole(d, static_cast<int>(members.size()));
      for (size_t i = 0; i < members.size(); ++i) {
        Owned& mine = owned_[members[i]];
        mine.muon.insert(mine.muon.end(), o[i].muon.begin(), o[i].muon.end());
        mine.adamw.insert(mine.adamw.end(), o[i].adamw.begin(), o[i].adamw.end());
      }
    }
    for (int r = 0; r < job_.world_size; ++r) {
      const int tp = job_.tp_group[r];
      if (tp < 0) {
        Update(r, owned_[r].muon);
      } else if (job_.groups[tp][0] == r) {
        MUONSHARD_RETURN_IF_ERROR(UpdateTpGroup(tp));
      }
      int64_t adamw = 0;
      for (const Chunk* c : owned_[r].adamw) adamw += AdamwBytes(job_, *c);
      s_.Elementwise(r, Phase::kAdamwElementwise, adamw, static_cast<int>(owned_[r].adamw.size()),
                     absl::StrCat("adamw r", r));
    }
    for (const DpGroup& d : job_.dp) {
      s_.Bucketed(OpKind::kAllGather, Phase::kSync, d.group, ParamBytes(d), "all_gather params");
    }
    return s_.Take();
  }

 private:
  // A rank without TP: Newton-Schulz of every owned matrix, then the
  // momentum and apply.
  void Update(int rank, const std::vector<const Matrix*>& muon) {
    std::vector<NsMatrix> ns;
    ns.reserve(muon.size());
    for (const Matrix* m : muon) ns.push_back(m->full);
    s_.Ns(rank, std::move(ns), absl::StrCat("ns r", rank));
    MuonElementwise(rank, muon);
  }
  void MuonElementwise(int rank, const std::vector<const Matrix*>& muon) {
    int64_t bytes = 0;
    for (const Matrix* m : muon) bytes += MuonBytes(job_, *m);
    s_.Elementwise(rank, Phase::kMuonElementwise, bytes, 2 * static_cast<int>(muon.size()),
                   absl::StrCat("muon r", rank));
  }

  // The split matrices of each member of a TP group, which must be the same
  // tensors in the same order (each member holds its shard of each).
  absl::StatusOr<std::vector<const Matrix*>> SplitOf(int tp_group) const {
    const std::vector<int>& members = job_.groups[tp_group];
    std::vector<std::vector<const Matrix*>> split(members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      for (const Matrix* m : owned_[members[i]].muon) {
        if (m->tp_split) split[i].push_back(m);
      }
      bool same = split[i].size() == split[0].size();
      for (size_t k = 0; same && k < split[i].size(); ++k) same = split[i][k]->tensor == split[0][k]->tensor;
      if (!same) {
        return absl::InvalidArgumentError(absl::StrCat("plan: TP group of ranks ", absl::StrJoin(members, ","),
                                                       ": its ranks own different split Muon tensors"));
      }
    }
    return split[0];
  }

  absl::Status UpdateTpGroup(int tp_group) {
    const std::vector<int>& members = job_.groups[tp_group];
    MUONSHARD_ASSIGN_OR_RETURN(const std::vector<const Matrix*> split, SplitOf(tp_group));
    const int tp = static_cast<int>(members.size());
    std::vector<std::vector<NsMatrix>> ns(tp);
    for (int i = 0; i < tp; ++i) {  // whole matrices: on their owner, as without TP
      for (const Matrix* m : owned_[members[i]].muon) {
        if (!m->tp_split) ns[i].push_back(m->full);
      }
    }
    if (mode_ == PeerStrategy::kMegatronLayerSharded) return LayerSharded(tp_group, split, ns);
    auto flush = [&] {
      for (int i = 0; i < tp; ++i) s_.Ns(members[i], std::exchange(ns[i], {}), absl::StrCat("ns r", members[i]));
    };
    for (const Matrix* m : split) {
      if (mode_ == PeerStrategy::kMegatronBlockwise) {
        for (int i = 0; i < tp; ++i) ns[i].push_back(m->shard);
      } else if (mode_ == PeerStrategy::kMegatronDuplicated) {
        flush();
        s_.Collective(OpKind::kAllGather, Phase::kTpExchange, tp_group, m->numel * tp * kFp32,
                      absl::StrCat("tp all_gather t", m->tensor));
        for (int i = 0; i < tp; ++i) ns[i].push_back(m->full);
      } else {  // distributed: each iteration on the shard, the Gram all-reduced
        for (int step = 0; step < job_.ns_steps; ++step) {
          for (int i = 0; i < tp; ++i) ns[i].push_back({m->full.flops / (job_.ns_steps * tp), m->full.min_dim});
          flush();
          s_.Collective(OpKind::kAllReduce, Phase::kTpExchange, tp_group, m->gram_bytes,
                        absl::StrCat("tp all_reduce gram t", m->tensor));
        }
      }
    }
    flush();
    for (int m : members) MuonElementwise(m, owned_[m].muon);
    return absl::OkStatus();
  }

  // PR #6683: every split matrix to one NS home in the TP group (LPT by NS
  // work), one fused all-to-all there and one back.
  absl::Status LayerSharded(int tp_group, std::vector<const Matrix*> split, std::vector<std::vector<NsMatrix>>& ns) {
    const std::vector<int>& members = job_.groups[tp_group];
    const int tp = static_cast<int>(members.size());
    int64_t shards = 0;
    for (const Matrix* m : split) shards += m->numel * kFp32;
    std::stable_sort(split.begin(), split.end(),
                     [](const Matrix* a, const Matrix* b) { return a->full.flops > b->full.flops; });
    std::vector<double> load(tp, 0);  // starting from each member's own whole matrices
    for (int i = 0; i < tp; ++i) {
      for (const NsMatrix& m : ns[i]) load[i] += m.flops;
    }
    for (const Matrix* m : split) {
      const int home = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      load[home] += m->full.flops;
      ns[home].push_back(m->full);
    }
    s_.Collective(OpKind::kAllToAll, Phase::kTpExchange, tp_group, shards, "tp all_to_all to homes");
    for (int i = 0; i < tp; ++i) s_.Ns(members[i], std::exchange(ns[i], {}), absl::StrCat("ns r", members[i]));
    s_.Collective(OpKind::kAllToAll, Phase::kTpExchange, tp_group, shards, "tp all_to_all back");
    for (int m : members) MuonElementwise(m, owned_[m].muon);
    return absl::OkStatus();
  }

  const Job& job_;
  const PeerStrategy mode_;
  Sequential s_;
  std::vector<Owned> owned_;  // per rank
};

// ---- KellerJordan/Muon: DDP all-reduce, round-robin all_gather ------------

StepProgram RoundRobin(const Job& job) {
  Sequential s(job, PeerStrategyName(PeerStrategy::kRoundRobinAllGather));
  for (const DpGroup& d : job.dp) {
    s.Bucketed(OpKind::kAllReduce, Phase::kReduce, d.group, GradBytes(job, d), "all_reduce grads");
  }
  for (const DpGroup& d : job.dp) {
    const std::vector<int>& members = job.groups[d.group];
    const size_t n = members.size();
    // MuonWithAuxAdam sorts its Muon parameters by size (torch.Size, descending).
    std::vector<const Matrix*> order;
    order.reserve(d.muon.size());
    for (const Matrix& m : d.muon) order.push_back(&m);
    std::stable_sort(order.begin(), order.end(), [](const Matrix* a, const Matrix* b) {
      return std::tie(a->rows, a->cols) > std::tie(b->rows, b->cols);
    });
    for (size_t base = 0; base < order.size(); base += n) {
      int64_t largest = 0;
      for (size_t i = 0; i < n && base + i < order.size(); ++i) {
        const Matrix& m = *order[base + i];
        // Not TP-aware: a TP shard is orthogonalised as the matrix.
        s.Ns(members[i], {m.tp_split ? m.shard : m.full}, absl::StrCat("ns t", m.tensor));
        s.Elementwise(members[i], Phase::kMuonElementwise, MuonBytes(job, m), 2, absl::StrCat("muon t", m.tensor));
        largest = std::max(largest, m.numel * Size(m.dtype));
      }
      s.Collective(OpKind::kAllGather, Phase::kSync, d.group, largest * static_cast<int64_t>(n),
                   absl::StrCat("all_gather round ", base / n));
    }
    int64_t adamw = 0;
    for (const Chunk& c : d.adamw) adamw += AdamwBytes(job, c);
    for (int r : members) {
      s.Elementwise(r, Phase::kAdamwElementwise, adamw, static_cast<int>(d.adamw.size()), "adamw (replicated)");
    }
  }
  return s.Take();
}

// ---- DeepSpeed ZeRO-1: all-reduce, flat partitions, all-gather ------------

StepProgram Zero1(const Job& job) {
  Sequential s(job, PeerStrategyName(PeerStrategy::kZero1));
  for (const DpGroup& d : job.dp) {
    s.Bucketed(OpKind::kAllReduce, Phase::kReduce, d.group, GradBytes(job, d), "all_reduce grads");
  }
  for (const DpGroup& d : job.dp) {
    const std::vector<int>& members = job.groups[d.group];
    const int64_t n = static_cast<int64_t>(members.size());
    int64_t total = 0;
    for (const Matrix& m : d.muon) total += m.numel;
    const int64_t part = (total + n - 1) / n;
    int64_t adamw = 0;
    for (const Chunk& c : d.adamw) adamw += AdamwBytes(job, c);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t lo = i * part, hi = std::min(total, lo + part);
      std::vector<NsMatrix> ns;
      int64_t bytes = 0;
      int calls = 0;
      int64_t begin = 0;
      for (const Matrix& m : d.muon) {
        const int64_t end = begin + m.numel;
        if (end > lo && begin < hi) {  // the whole matrix, on every rank its partition touches
          ns.push_back(m.tp_split ? m.shard : m.full);
          bytes += (std::min(end, hi) - std::max(begin, lo)) * MuonBytesPerElement(m.dtype, job.grad);
          calls += 2;
        }
        begin = end;
      }
      const int r = members[i];
      s.Ns(r, std::move(ns), absl::StrCat("ns r", r));
      s.Elementwise(r, Phase::kMuonElementwise, bytes, calls, absl::StrCat("muon r", r));
      s.Elementwise(r, Phase::kAdamwElementwise, adamw / n, 1, absl::StrCat("adamw r", r));
    }
  }
  for (const DpGroup& d : job.dp) {
    s.Bucketed(OpKind::kAllGather, Phase::kSync, d.group, ParamBytes(d), "all_gather params");
  }
  return s.Take();
}

// ---- microsoft/dion (torchtitan): FSDP + all-to-all, overlapped ----------

class AllToAll {
 public:
  explicit AllToAll(const Job& job) : job_(job) {
    p_.name = PeerStrategyName(PeerStrategy::kAllToAll);
    p_.world_size = job.world_size;
    p_.groups = job.groups;
    for (int r = 0; r < job.world_size; ++r) {
      compute_.push_back(p_.AddLane({"compute", {r}, LaneOrder::kAsReady, {}}));
    }
  }

  StepProgram Build() {
    for (const DpGroup& d : job_.dp) Group(d);
    return std::move(p_);
  }

 private:
  int Op(StepOp op, std::vector<int> deps) {
    op.deps = std::move(deps);
    return p_.AddOp(std::move(op));
  }
  int Comm(int lane, OpKind kind, Phase phase, int group, int64_t bytes, std::string label, std::vector<int> deps) {
    StepOp op;
    op.kind = kind;
    op.phase = phase;
    op.group = group;
    op.bytes = bytes;
    op.label = std::move(label);
    const int i = Op(std::move(op), std::move(deps));
    p_.Append(lane, i, true);
    return i;
  }
  int Compute(int rank, StepOp op, std::vector<int> deps) {
    op.rank = rank;
    const int i = Op(std::move(op), std::move(deps));
    p_.Append(compute_[rank], i, true);
    return i;
  }
  static StepOp Elementwise(Phase phase, int64_t bytes, int calls, std::string label) {
    StepOp op;
    op.kind = OpKind::kElementwise;
    op.phase = phase;
    op.memory_bytes = bytes;
    op.calls = std::max(1, calls);
    op.label = std::move(label);
    return op;
  }

  void Group(const DpGroup& d);

  const Job& job_;
  StepProgram p_;
  std::vector<int> compute_;
};

void AllToAll::Group(const DpGroup& d) {
  const std::vector<int>& members = job_.groups[d.group];
  const int n = static_cast<int>(members.size());
  // Batches of n matrices of one shape (Dion groups parameters by shape).
  std::vector<const Matrix*> order;
  for (const Matrix& m : d.muon) order.push_back(&m);
  std::stable_sort(order.begin(), order.end(), [](const Matrix* a, const Matrix* b) {
    return std::tie(a->numel, a->full.min_dim) > std::tie(b->numel, b->full.min_dim);
  });
  int64_t muon_bytes = 0, adamw_bytes = 0;
  for (const Matrix& m : d.muon) muon_bytes += MuonBytes(job_, m);
  for (const Chunk& c : d.adamw) adamw_bytes += AdamwBytes(job_, c);
  if (n < 2) {  // nothing to shard: the rank updates everything itself
    StepOp ns;
    ns.kind = OpKind::kNewtonSchulz;
    ns.phase = Phase::kNewtonSchulz;
    for (const Matrix* m : order) ns.matrices.push_back(m->tp_split ? m->shard : m->full);
    ns.label = "ns";
    if (!ns.matrices.empty()) Compute(members[0], std::move(ns), {});
    Compute(members[0], Elementwise(Phase::kMuonElementwise, muon_bytes, 2 * static_cast<int>(d.muon.size()), "muon"),
            {});
    Compute(members[0], Elementwise(Phase::kAdamwElementwise, adamw_bytes, 1, "adamw"), {});
    return;
  }
  const int lane = p_.AddLane({absl::StrCat("comm g", d.group), members, LaneOrder::kInOrder, {}});
  int last_reduce = -1;
  for (int64_t done = 0, total = GradBytes(job_, d), k = 0; done < total; ++k) {
    const int64_t b = std::min(job_.bucket_bytes, total - done);
    last_reduce =
        Comm(lane, OpKind::kReduceScatter, Phase::kReduce, d.group, b, absl::StrCat("reduce_scatter ", k), {});
    done += b;
  }
  std::vector<int> before_gathers, after;
  for (int r : members) {  // the momentum of the rank's shards, then its AdamW shard
    before_gathers.push_back(Compute(
        r, Elementwise(Phase::kMuonElementwise, muon_bytes / n, 2 * static_cast<int>(d.muon.size()), "muon shard"),
        {last_reduce}));
    after.push_back(
        Compute(r, Elementwise(Phase::kAdamwElementwise, adamw_bytes / n, 1, "adamw shard"), {last_reduce}));
  }
  std::vector<std::vector<int>> ns_of_batch;
  std::vector<int64_t> batch_bytes;
  for (size_t base = 0; base < order.size(); base += n) {
    // Each member hands its 1/n of every matrix of the batch, in bf16
    // (muon_update_pre_orthogonalize casts before communicating).
    int64_t bytes = 0;
    for (size_t i = 0; i < static_cast<size_t>(n) && base + i < order.size(); ++i) {
      bytes += order[base + i]->numel * kBf16 / n;
    }
    const int gather = Comm(lane, OpKind::kAllToAll, Phase::kTpExchange, d.group, bytes,
                            absl::StrCat("all_to_all batch ", base / n), before_gathers);
    std::vector<int> ns;
    for (size_t i = 0; i < static_cast<size_t>(n) && base + i < order.size(); ++i) {
      const Matrix& m = *order[base + i];
      StepOp op;
      op.kind = OpKind::kNewtonSchulz;
      op.phase = Phase::kNewtonSchulz;
      op.matrices = {m.tp_split ? m.shard : m.full};
      op.label = absl::StrCat("ns t", m.tensor);
      ns.push_back(Compute(members[i], std::move(op), {gather}));
    }
    ns_of_batch.push_back(std::move(ns));
    batch_bytes.push_back(bytes);
  }
  for (size_t b = 0; b < ns_of_batch.size(); ++b) {
    after.push_back(Comm(lane, OpKind::kAllToAll, Phase::kTpExchange, d.group, batch_bytes[b],
                         absl::StrCat("all_to_all back ", b), ns_of_batch[b]));
  }
  for (int64_t done = 0, total = ParamBytes(d), k = 0; done < total; ++k) {
    const int64_t b = std::min(job_.bucket_bytes, total - done);
    Comm(lane, OpKind::kAllGather, Phase::kSync, d.group, b, absl::StrCat("all_gather ", k), after);
    done += b;
  }
}

}  // namespace

const char* PeerStrategyName(PeerStrategy strategy) {
  for (const Named& n : kNames) {
    if (n.strategy == strategy) return n.name;
  }
  return "?";
}

bool OrthogonalisesWholeMatrices(PeerStrategy strategy, int tp) {
  if (tp <= 1) return true;
  return strategy == PeerStrategy::kMegatronDuplicated || strategy == PeerStrategy::kMegatronDistributed ||
         strategy == PeerStrategy::kMegatronLayerSharded;
}

std::vector<PeerStrategy> AllPeerStrategies() {
  std::vector<PeerStrategy> all;
  for (const Named& n : kNames) all.push_back(n.strategy);
  return all;
}

absl::StatusOr<PeerStrategy> ParsePeerStrategy(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  std::vector<std::string> known;
  for (const Named& n : kNames) {
    if (lower == n.name) return n.strategy;
    known.emplace_back(n.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", name, "\" is not a peer strategy (", absl::StrJoin(known, ", "), ")"));
}

absl::StatusOr<StepProgram> BuildPeerProgram(const v1::Plan& plan, PeerStrategy strategy) {
  MUONSHARD_ASSIGN_OR_RETURN(const Job job, JobOf(plan));
  switch (strategy) {
    case PeerStrategy::kMegatronDuplicated:
    case PeerStrategy::kMegatronDistributed:
    case PeerStrategy::kMegatronBlockwise:
    case PeerStrategy::kMegatronLayerSharded:
      return Megatron(job, strategy).Build();
    case PeerStrategy::kRoundRobinAllGather:
      return RoundRobin(job);
    case PeerStrategy::kAllToAll:
      return AllToAll(job).Build();
    case PeerStrategy::kZero1:
      return Zero1(job);
  }
  return absl::InvalidArgumentError("unknown peer strategy");
}

absl::StatusOr<StepProgram> BuildPaddleSeedProgram(const v1::Plan& seed_plan) {
  if (seed_plan.policy().policy() != v1::SEED) {
    return absl::InvalidArgumentError(
        absl::StrCat("paddle seed: the plan's policy is ", v1::Policy_Name(seed_plan.policy().policy()), ", not SEED"));
  }
  MUONSHARD_ASSIGN_OR_RETURN(StepProgram p, BuildPlanProgram(seed_plan, Schedule::kSequential));
  p.name = "paddle seed";
  return p;
}

}  // namespace muonshard::sim
