#include "sim/plan_program.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/model.h"
#include "plan/muon_rounds.h"
#include "plan/ns_batches.h"
#include "plan/ns_blocks.h"
#include "plan/plan_stats.h"
#include "plan/tensor_parallel.h"
#include "plan/tp_rounds.h"

namespace muonshard::sim {

const char* ScheduleName(Schedule schedule) { return schedule == Schedule::kSequential ? "sequential" : "pipelined"; }

absl::StatusOr<Schedule> ParseSchedule(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "sequential") return Schedule::kSequential;
  if (n == "pipelined") return Schedule::kPipelined;
  return absl::InvalidArgumentError(absl::StrCat("\"", name, "\" is not one of sequential, pipelined"));
}

int64_t MuonBytesPerElement(v1::DType param, v1::DType grad) {
  const int64_t cast = planner::KeepsMaster(param) ? planner::DTypeSize(param) : 0;
  return planner::DTypeSize(grad) + 8 + 8 + 8 + cast;  // momentum, update, master
}

int64_t AdamwBytesPerElement(v1::DType param, v1::DType grad) {
  const int64_t cast = planner::KeepsMaster(param) ? planner::DTypeSize(param) : 0;
  return planner::DTypeSize(grad) + 16 + 8 + cast;  // two moments, master
}

namespace {

struct BucketKey {
  bool muon = true;
  int index = 0;  // position in plan.muon_buckets() / adamw_buckets()
};

// Takes part in its round's TP collectives: gathered (or all-gathered) and
// scattered, or orthogonalised in place with its Gram matrices all-reduced.
bool Exchanges(const v1::OwnedTensor& o) {
  return o.tp_op() == v1::TP_OP_GATHER_SCATTER || o.tp_op() == v1::TP_OP_ALL_GATHER ||
         o.tp_op() == v1::TP_OP_SHARDED_NS;
}

int64_t MinDim(const v1::PlannedTensor& t) {
  const int n = t.shape_size();
  if (n >= 2) return std::max<int64_t>(1, std::min(t.shape(n - 2), t.shape(n - 1)));
  return n == 1 ? std::max<int64_t>(1, t.shape(0)) : 1;
}

// NOTE [Batched NS cost] (sim/cluster.h): the Newton-Schulz calls of a
// rank's owned tensors, as the worker's BucketUpdater makes them (NOTE
// [Batched Muon], NOTE [Muon batches] in plan/ns_batches.h): with fp32
// gradients, the unblocked tensors of one shape (rows, cols and matrices: a
// stack goes with stacks of its size) and layout go into batched calls
// (planner::NsBatches; the worker also splits by the decay flag, which the
// plan does not hold); a blocked tensor is a call per block shape of its own
// (its blocks batched inside: planner::NsBlockShapes); a TP-exchanged or
// TP-local one, or any tensor with 16-bit gradients, a call of its own (a
// 3-D stack's matrices batched inside).
struct NsCallBuilder {
  std::vector<planner::NsBatchItem> items;  // the batchable tensors
  std::vector<NsMatrix> of_item;            // their flops, min_dim, matrices

  // The calls of the items so far, in batches of at most `max_elements`
  // (<= 0: no limit), appended to `out`; then no items.
  void Flush(int64_t max_elements, std::vector<NsMatrix>& out) {
    for (const std::vector<int>& batch : planner::NsBatches(items, max_elements)) {
      NsMatrix call{0, of_item[batch.front()].min_dim, 0};
      for (int i : batch) {
        call.flops += of_item[i].flops;
        call.count += of_item[i].count;
      }
      out.push_back(call);
    }
    items.clear();
    of_item.clear();
  }
};

void AddNsCalls(const v1::OwnedTensor& o, const v1::PlannedTensor& t, bool batch_across, NsCallBuilder& batched,
                std::vector<NsMatrix>& own) {
  if (o.ns_flops() <= 0) return;
  const int n = t.shape_size();
  const int64_t rows = n >= 2 ? t.shape(n - 2) : 1;
  const int64_t cols = n >= 1 ? t.shape(n - 1) : 1;
  const int64_t per_matrix = std::max<int64_t>(1, rows * cols);
  const int64_t matrices = o.matrix_end() > o.matrix_begin() ? o.matrix_end() - o.matrix_begin()
                                                             : std::max<int64_t>(1, o.numel() / per_matrix);
  if (o.tp_op() != v1::TP_OP_NONE || n < 2) {
    own.push_back({o.ns_flops(), MinDim(t), matrices});
    return;
  }
  if (t.has_ns_blocks() && t.ns_blocks().axis() != v1::NsBlocks::AXIS_UNSPECIFIED) {
    const std::vector<planner::NsBlockShape> shapes = planner::NsBlockShapes(t.ns_blocks(), rows, cols);
    double total = 0;
    for (const planner::NsBlockShape& b : shapes) total += b.count * planner::NsFlops(b.rows, b.cols, 1);
    for (const planner::NsBlockShape& b : shapes) {
      const double share = total > 0 ? b.count * planner::NsFlops(b.rows, b.cols, 1) / total : 0;
      own.push_back({o.ns_flops() * share, std::max<int64_t>(1, std::min(b.rows, b.cols)), b.count * matrices});
    }
    return;
  }
  if (!batch_across) {
    own.push_back({o.ns_flops(), MinDim(t), matrices});
    return;
  }
  batched.items.push_back({{rows, cols, matrices, static_cast<int>(t.layout()), 0}, per_matrix * matrices});
  batched.of_item.push_back({o.ns_flops(), MinDim(t), matrices});
}

// The plan's references, resolved and checked once.
struct PlanIndex {
  int world_size = 0;
  int gpus_per_node = 0;
  std::vector<std::vector<int>> groups;  // by position
  std::vector<int> muon_group, muon_root, muon_last;
  std::vector<int> adamw_group, adamw_last;
  std::vector<std::vector<BucketKey>> group_buckets;          // Muon, then AdamW, by position
  std::vector<std::vector<std::pair<int, int>>> rank_groups;  // per rank: (group, position in it)
  std::vector<std::map<int, std::vector<int>>> owned;         // per rank: muon bucket -> owned indices
  std::vector<const v1::RankPlan*> rank_plan;                 // per rank
  absl::flat_hash_map<int, int> group_of_id;
};

absl::Status IndexGroups(const v1::Plan& plan, PlanIndex& x) {
  x.world_size = plan.topology().world_size() > 0 ? plan.topology().world_size() : plan.ranks_size();
  x.gpus_per_node = plan.topology().gpus_per_node();
  x.rank_groups.assign(x.world_size, {});
  for (int g = 0; g < plan.groups_size(); ++g) {
    const v1::CommGroup& group = plan.groups(g);
    x.group_of_id[group.id()] = g;
    x.groups.emplace_back(group.ranks().begin(), group.ranks().end());
    for (int i = 0; i < group.ranks_size(); ++i) {
      const int r = group.ranks(i);
      if (r < 0 || r >= x.world_size) {
        return absl::InvalidArgumentError(absl::StrCat("plan: group ", group.id(), ": rank ", r, " out of range"));
      }
      x.rank_groups[r].push_back({g, i});
    }
  }
  x.group_buckets.assign(plan.groups_size(), {});
  return absl::OkStatus();
}

absl::StatusOr<int> GroupOf(const PlanIndex& x, const std::string& what, int id) {
  auto it = x.group_of_id.find(id);
  if (it == x.group_of_id.end()) {
    return absl::InvalidArgumentError(absl::StrCat("plan: ", what, ": group ", id, " is not in the plan"));
  }
  return it->second;
}

absl::Status IndexBuckets(const v1::Plan& plan, PlanIndex& x) {
  for (int b = 0; b < plan.muon_buckets_size(); ++b) {
    const v1::MuonBucket& mb = plan.muon_buckets(b);
    const std::string what = absl::StrCat("Muon bucket ", mb.id());
    MUONSHARD_ASSIGN_OR_RETURN(const int g, GroupOf(x, what, mb.group()));
    const std::vector<int>& members = x.groups[g];
    const auto owner = std::find(members.begin(), members.end(), mb.owner());
    if (owner == members.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: ", what, ": owner ", mb.owner(), " is not in group ", mb.group()));
    }
    x.muon_group.push_back(g);
    x.muon_root.push_back(static_cast<int>(owner - members.begin()));
    x.muon_last.push_back(planner::LastTensorOf(mb.entries()));
    x.group_buckets[g].push_back({true, b});
  }
  for (int b = 0; b < plan.adamw_buckets_size(); ++b) {
    const v1::AdamwBucket& ab = plan.adamw_buckets(b);
    const std::string what = absl::StrCat("AdamW bucket ", ab.id());
    MUONSHARD_ASSIGN_OR_RETURN(const int g, GroupOf(x, what, ab.group()));
    if (ab.shard_offsets_size() != static_cast<int>(x.groups[g].size()) + 1) {
      return absl::InvalidArgumentError(absl::StrCat("plan: ", what, ": ", ab.shard_offsets_size(),
                                                     " shard offsets for a group of ", x.groups[g].size()));
    }
    x.adamw_group.push_back(g);
    x.adamw_last.push_back(planner::LastTensorOf(ab.entries()));
    x.group_buckets[g].push_back({false, b});
  }
  return absl::OkStatus();
}

absl::Status IndexOwned(const v1::Plan& plan, PlanIndex& x) {
  absl::flat_hash_map<int, int> muon_of_id;
  for (int b = 0; b < plan.muon_buckets_size(); ++b) muon_of_id[plan.muon_buckets(b).id()] = b;
  x.owned.assign(x.world_size, {});
  x.rank_plan.assign(x.world_size, nullptr);
  for (const v1::RankPlan& r : plan.ranks()) {
    if (r.rank() < 0 || r.rank() >= x.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("plan: rank ", r.rank(), " out of range"));
    }
    x.rank_plan[r.rank()] = &r;
    for (int j = 0; j < r.owned_size(); ++j) {
      const v1::OwnedTensor& o = r.owned(j);
      auto it = muon_of_id.find(o.bucket());
      if (it == muon_of_id.end() || o.tensor() < 0 || o.tensor() >= plan.tensors_size()) {
        return absl::InvalidArgumentError(absl::StrCat("plan: rank ", r.rank(), ": owned tensor ", o.tensor(),
                                                       " or its Muon bucket ", o.bucket(), " is not in the plan"));
      }
      if (Exchanges(o)) MUONSHARD_RETURN_IF_ERROR(GroupOf(x, absl::StrCat("rank ", r.rank()), o.tp_group()).status());
      x.owned[r.rank()][it->second].push_back(j);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanIndex> IndexPlan(const v1::Plan& plan) {
  PlanIndex x;
  MUONSHARD_RETURN_IF_ERROR(IndexGroups(plan, x));
  MUONSHARD_RETURN_IF_ERROR(IndexBuckets(plan, x));
  MUONSHARD_RETURN_IF_ERROR(IndexOwned(plan, x));
  return x;
}

// The TP exchange ops of one bucket of a TP group: gathers (and the
// duplicated mode's all-gather) before Newton-Schulz, scatters after.
struct Exchange {
  std::vector<int> before_ns;
  std::vector<int> after_ns;
};

// Per-member payload of one exchange, by batch (NS tp rank; tp = all-gather),
// and the bytes of the Gram matrices and norms each member all-reduces
// (TP_OP_SHARDED_NS).
struct ExchangeBytes {
  std::vector<std::vector<int64_t>> gather_send, gather_recv, scatter_send, scatter_recv;
  std::vector<int64_t> all_reduce;
  explicit ExchangeBytes(int tp)
      : gather_send(tp + 1, std::vector<int64_t>(tp, 0)),
        gather_recv(tp + 1, std::vector<int64_t>(tp, 0)),
        scatter_send(tp + 1, std::vector<int64_t>(tp, 0)),
        scatter_recv(tp + 1, std::vector<int64_t>(tp, 0)),
        all_reduce(tp, 0) {}
};

class Builder {
 public:
  Builder(const v1::Plan& plan, const PlanIndex& index, Schedule schedule, NsCalls ns_calls, int64_t muon_batch_mib)
      : plan_(plan),
        x_(index),
        schedule_(schedule),
        ns_calls_(ns_calls),
        max_batch_(planner::MuonBatchElements(muon_batch_mib)),
        grad_(planner::GradDType(plan.policy())) {}

  absl::StatusOr<StepProgram> Build();

 private:
  std::string Name(const BucketKey& k) const {
    return absl::StrCat(k.muon ? "M" : "A",
                        k.muon ? plan_.muon_buckets(k.index).id() : plan_.adamw_buckets(k.index).id());
  }
  // A Muon bucket's name, or a round's: its first bucket's and how many more.
  std::string RoundName(const std::vector<int>& buckets) const {
    std::string name = Name({true, buckets[0]});
    if (buckets.size() > 1) absl::StrAppend(&name, "+", buckets.size() - 1);
    return name;
  }
  int64_t LargestBucket(const std::vector<int>& buckets) const {
    int64_t largest = 0;
    for (int b : buckets) largest = std::max(largest, plan_.muon_buckets(b).numel());
    return largest;
  }
  int GroupOfKey(const BucketKey& k) const { return k.muon ? x_.muon_group[k.index] : x_.adamw_group[k.index]; }
  bool Shared(int group) const { return x_.groups[group].size() > 1; }
  std::vector<BucketKey> HandOffOrder(int group) const;
  // HandOffOrder(group) with the buckets of a scatter round (NOTE [Muon
  // scatter rounds]) stood for by the round's last one there.
  std::vector<BucketKey> CommOrder(int group) const;
  absl::Status IndexScatterRounds();
  // The Muon buckets a reduce or sync op of `k` moves: its scatter round's,
  // or itself.
  std::vector<int> MovedWith(const BucketKey& k) const;
  void OrderExchanges();

  int ReduceOp(const BucketKey& k);
  int SyncOp(const BucketKey& k, std::vector<int> deps);
  int AdamwOp(int rank, int bucket, int member);
  // The update of a rank's Muon buckets `buckets` (one bucket, an exchange
  // round, or the sequential step's buckets without exchanges) as one block
  // of ops; its NS calls batched across the buckets when `across`, else
  // bucket by bucket, in batches of at most `max_batch` elements (<= 0: no
  // limit; NOTE [Muon batches]).
  absl::StatusOr<std::vector<int>> MuonBlock(int rank, const std::vector<int>& buckets, bool across, int64_t max_batch);
  absl::StatusOr<const Exchange*> ExchangeOf(int rank, int round);
  absl::Status AddExchangeBytes(int member, int rank, int bucket, int tp, ExchangeBytes& bytes) const;
  void AddExchangeOps(int tp_group, const std::string& name, const ExchangeBytes& bytes, Exchange& ex);

  absl::Status BuildSequential();
  absl::Status BuildPipelined();
  absl::Status PipelinedMuonBlocks(int rank, const std::vector<int>& muon_reduce, std::vector<int>& muon_done);
  void AppendBlock(int lane, const std::vector<int>& block);

  const v1::Plan& plan_;
  const PlanIndex& x_;
  const Schedule schedule_;
  const NsCalls ns_calls_;
  const int64_t max_batch_;  // the sequential step's, elements (0: by bucket)
  const v1::DType grad_;
  StepProgram p_;
  std::vector<int> lane_of_rank_;
  // TP: per rank its exchange rounds (NOTE [TP exchange rounds]), in the
  // order it updates them, and the round of each bucket in them; the
  // exchanges made so far, by (TP group, round).
  std::vector<std::vector<std::vector<int>>> exchange_rounds_;
  std::vector<absl::flat_hash_map<int, int>> exchange_round_of_;
  std::map<std::pair<int, int>, Exchange> exchanges_;
  int next_call_group_ = 0;  // StepOp::call_group
  // MUON_REDUCE_SCATTER_ROUNDS: each Muon bucket's scatter round (-1: it
  // goes to its owner), and each round's buckets in segment order.
  std::vector<int> scatter_round_of_;
  std::vector<std::vector<int>> scatter_rounds_;
};

std::vector<BucketKey> Builder::HandOffOrder(int group) const {
  std::vector<BucketKey> keys = x_.group_buckets[group];
  if (schedule_ == Schedule::kPipelined) {
    std::stable_sort(keys.begin(), keys.end(), [&](const BucketKey& a, const BucketKey& b) {
      return (a.muon ? x_.muon_last[a.index] : x_.adamw_last[a.index]) >
             (b.muon ? x_.muon_last[b.index] : x_.adamw_last[b.index]);
    });
  }
  return keys;
}

std::vector<BucketKey> Builder::CommOrder(int group) const {
  const std::vector<BucketKey> keys = HandOffOrder(group);
  std::vector<int> round_at_place;
  round_at_place.reserve(keys.size());
  for (const BucketKey& k : keys) round_at_place.push_back(k.muon ? scatter_round_of_[k.index] : -1);
  const std::vector<int> places = planner::RoundPlaces(round_at_place);
  std::vector<BucketKey> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (places[i] != planner::kNoRoundHere) out.push_back(keys[i]);
  }
  return out;
}

absl::Status Builder::IndexScatterRounds() {
  scatter_round_of_.assign(plan_.muon_buckets_size(), -1);
  MUONSHARD_ASSIGN_OR_RETURN(const std::vector<std::vector<planner::MuonRound>> rounds,
                             planner::MuonScatterRoundsOf(plan_));
  for (const std::vector<planner::MuonRound>& of_group : rounds) {
    for (const planner::MuonRound& round : of_group) {
      if (!round.scatter) continue;
      for (int b : round.buckets) scatter_round_of_[b] = static_cast<int>(scatter_rounds_.size());
      scatter_rounds_.push_back(round.buckets);
    }
  }
  return absl::OkStatus();
}

std::vector<int> Builder::MovedWith(const BucketKey& k) const {
  if (!k.muon || scatter_round_of_[k.index] < 0) return {k.index};
  return scatter_rounds_[scatter_round_of_[k.index]];
}

// The same rounds in both schedules, as the worker runs them.
void Builder::OrderExchanges() {
  exchange_rounds_.assign(x_.world_size, {});
  exchange_round_of_.assign(x_.world_size, {});
  for (int r = 0; r < x_.world_size; ++r) {
    exchange_rounds_[r] = planner::TpExchangeRoundsOf(plan_, *x_.rank_plan[r]);
    for (size_t k = 0; k < exchange_rounds_[r].size(); ++k) {
      for (int bucket : exchange_rounds_[r][k]) exchange_round_of_[r][bucket] = static_cast<int>(k);
    }
  }
}

int Builder::ReduceOp(const BucketKey& k) {
  StepOp op;
  op.phase = Phase::kReduce;
  op.group = GroupOfKey(k);
  if (k.muon && scatter_round_of_[k.index] >= 0) {
    // A scatter round: its segments at the pace of the largest.
    const std::vector<int> round = MovedWith(k);
    op.kind = OpKind::kReduceScatter;
    op.bytes = static_cast<int64_t>(x_.groups[op.group].size()) * LargestBucket(round) * planner::DTypeSize(grad_);
    op.label = absl::StrCat("reduce_scatter ", RoundName(round));
    return p_.AddOp(std::move(op));
  }
  if (k.muon) {
    op.kind = OpKind::kReduce;
    op.root = x_.muon_root[k.index];
    op.bytes = plan_.muon_buckets(k.index).numel() * planner::DTypeSize(grad_);
  } else {
    op.kind = OpKind::kReduceScatter;
    op.bytes = plan_.adamw_buckets(k.index).numel() * planner::DTypeSize(grad_);
  }
  op.label = absl::StrCat(OpKindName(op.kind), " ", Name(k));
  return p_.AddOp(std::move(op));
}

int Builder::SyncOp(const BucketKey& k, std::vector<int> deps) {
  StepOp op;
  op.phase = Phase::kSync;
  op.group = GroupOfKey(k);
  if (k.muon && scatter_round_of_[k.index] >= 0) {
    const std::vector<int> round = MovedWith(k);
    op.kind = OpKind::kAllGather;
    op.bytes = static_cast<int64_t>(x_.groups[op.group].size()) * LargestBucket(round) *
               planner::DTypeSize(plan_.muon_buckets(k.index).dtype());
    op.label = absl::StrCat("all_gather ", RoundName(round));
    op.deps = std::move(deps);
    return p_.AddOp(std::move(op));
  }
  if (k.muon) {
    const v1::MuonBucket& b = plan_.muon_buckets(k.index);
    op.kind = OpKind::kBroadcast;
    op.root = x_.muon_root[k.index];
    op.bytes = b.numel() * planner::DTypeSize(b.dtype());
  } else {
    const v1::AdamwBucket& b = plan_.adamw_buckets(k.index);
    op.kind = OpKind::kAllGather;
    op.bytes = b.numel() * planner::DTypeSize(b.dtype());
  }
  op.label = absl::StrCat(OpKindName(op.kind), " ", Name(k));
  op.deps = std::move(deps);
  return p_.AddOp(std::move(op));
}

int Builder::AdamwOp(int rank, int bucket, int member) {
  const v1::AdamwBucket& b = plan_.adamw_buckets(bucket);
  StepOp op;
  op.kind = OpKind::kElementwise;
  op.phase = Phase::kAdamwElementwise;
  op.rank = rank;
  op.memory_bytes = (b.shard_offsets(member + 1) - b.shard_offsets(member)) * AdamwBytesPerElement(b.dtype(), grad_);
  op.label = absl::StrCat("adamw ", Name({false, bucket}), " r", rank);
  return p_.AddOp(std::move(op));
}

absl::Status Builder::AddExchangeBytes(int member, int rank, int bucket, int tp, ExchangeBytes& bytes) const {
  const v1::RankPlan& rp = *x_.rank_plan[rank];
  for (int j : x_.owned[rank].at(bucket)) {
    const v1::OwnedTensor& o = rp.owned(j);
    if (!Exchanges(o)) continue;
    if (o.tp_op() == v1::TP_OP_SHARDED_NS) {
      const std::optional<planner::ShardedNs> ns = planner::ShardedNsOf(plan_.tensors(o.tensor()));
      if (!ns.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("plan: rank ", rank, ": owned tensor ", o.tensor(),
                                                       ": TP_OP_SHARDED_NS on a matrix it cannot shard"));
      }
      bytes.all_reduce[member] += (o.matrix_end() - o.matrix_begin()) *
                                  ns->AllReducedFloats(plan_.policy().ns_steps()) * planner::kTpOpBytesPerElem;
      continue;
    }
    if (o.tp_op() == v1::TP_OP_ALL_GATHER) {
      bytes.gather_send[tp][member] += o.tp_send_bytes();
      bytes.gather_recv[tp][member] += o.tp_recv_bytes();
      continue;
    }
    const int t = o.ns_tp_rank();
    if (t < 0 || t >= tp) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: rank ", rank, ": owned tensor ", o.tensor(), ": ns_tp_rank ", t, " out of range"));
    }
    if (t == member) {  // the NS rank: receives the shards, sends the results
      bytes.gather_recv[t][member] += o.tp_recv_bytes();
      bytes.scatter_send[t][member] += o.tp_send_bytes();
    } else {
      bytes.gather_send[t][member] += o.tp_send_bytes();
      bytes.scatter_recv[t][member] += o.tp_recv_bytes();
    }
  }
  return absl::OkStatus();
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t b : v) s += b;
  return s;
}

// The worker issues a round's gathers as one group call and its scatters as
// another (RunGrouped in TpMuonExchange).
void Builder::AddExchangeOps(int tp_group, const std::string& name, const ExchangeBytes& bytes, Exchange& ex) {
  const int tp = static_cast<int>(x_.groups[tp_group].size());
  const int gathers = next_call_group_++, scatters = next_call_group_++;
  auto add = [&](OpKind kind, int root, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                 int64_t total) {
    StepOp op;
    if (root >= 0) op.call_group = kind == OpKind::kGather ? gathers : scatters;
    op.kind = kind;
    op.phase = Phase::kTpExchange;
    op.group = tp_group;
    op.root = root;
    op.bytes = total;
    op.member_send = send;
    op.member_recv = recv;
    op.label = root >= 0 ? absl::StrCat("tp ", OpKindName(kind), " ", name, " t", root)
                         : absl::StrCat("tp ", OpKindName(kind), " ", name);
    return p_.AddOp(std::move(op));
  };
  for (int t = 0; t < tp; ++t) {
    if (Sum(bytes.gather_send[t]) + Sum(bytes.gather_recv[t]) > 0) {
      ex.before_ns.push_back(
          add(OpKind::kGather, t, bytes.gather_send[t], bytes.gather_recv[t], Sum(bytes.gather_send[t])));
    }
  }
  const int64_t all = Sum(bytes.gather_send[tp]);
  if (all > 0) {  // the assembled matrices: every member's shards
    ex.before_ns.push_back(
        add(OpKind::kAllGather, -1, bytes.gather_send[tp], bytes.gather_recv[tp], all / std::max(1, tp - 1)));
  }
  // NOTE [Sharded Newton-Schulz]: after the round's NS, its Gram matrices
  // summed over the group; one all-reduce of them all (the worker makes
  // steps + 1 calls per shard shape, whose latencies this leaves out).
  const int64_t all_reduced = *std::max_element(bytes.all_reduce.begin(), bytes.all_reduce.end());
  if (all_reduced > 0) {
    StepOp op;
    op.kind = OpKind::kAllReduce;
    op.phase = Phase::kTpExchange;
    op.group = tp_group;
    op.bytes = all_reduced;
    op.label = absl::StrCat("tp all-reduce gram ", name);
    ex.after_ns.push_back(p_.AddOp(std::move(op)));
  }
  for (int t = 0; t < tp; ++t) {
    if (Sum(bytes.scatter_send[t]) + Sum(bytes.scatter_recv[t]) > 0) {
      ex.after_ns.push_back(
          add(OpKind::kScatter, t, bytes.scatter_send[t], bytes.scatter_recv[t], Sum(bytes.scatter_send[t])));
    }
  }
}

absl::StatusOr<const Exchange*> Builder::ExchangeOf(int rank, int round) {
  const v1::RankPlan& rp = *x_.rank_plan[rank];
  const std::vector<int>& buckets = exchange_rounds_[rank][round];
  int tp_group = -1;
  for (int j : x_.owned[rank].at(buckets[0])) {
    if (Exchanges(rp.owned(j))) {
      tp_group = x_.group_of_id.at(rp.owned(j).tp_group());
      break;
    }
  }
  auto [it, inserted] = exchanges_.try_emplace({tp_group, round});
  if (!inserted) return &it->second;
  const std::vector<int>& members = x_.groups[tp_group];
  const int tp = static_cast<int>(members.size());
  ExchangeBytes bytes(tp);
  for (int i = 0; i < tp; ++i) {
    const int m = members[i];
    if (exchange_rounds_[m].size() != exchange_rounds_[rank].size()) {
      return absl::InvalidArgumentError(absl::StrCat("plan: TP group ", plan_.groups(tp_group).id(), ": rank ", rank,
                                                     " exchanges TP shards in ", exchange_rounds_[rank].size(),
                                                     " rounds, rank ", m, " in ", exchange_rounds_[m].size()));
    }
    for (int bucket : exchange_rounds_[m][round]) {
      MUONSHARD_RETURN_IF_ERROR(AddExchangeBytes(i, m, bucket, tp, bytes));
    }
  }
  AddExchangeOps(tp_group, RoundName(exchange_rounds_[members[0]][round]), bytes, it->second);
  return &it->second;
}

absl::StatusOr<std::vector<int>> Builder::MuonBlock(int rank, const std::vector<int>& buckets, bool across,
                                                    int64_t max_batch) {
  const v1::RankPlan& rp = *x_.rank_plan[rank];
  int64_t memory_bytes = 0;
  int calls = 0;
  bool exchanges = false;
  StepOp ns;
  NsCallBuilder batched;
  for (int bucket : buckets) {
    const v1::MuonBucket& mb = plan_.muon_buckets(bucket);
    int64_t numel = 0;
    for (int j : x_.owned[rank].at(bucket)) {
      const v1::OwnedTensor& o = rp.owned(j);
      numel += o.numel();
      calls += 2;  // momentum, apply
      exchanges = exchanges || Exchanges(o);
      if (ns_calls_ == NsCalls::kPerTensor) {
        if (o.ns_flops() > 0) ns.matrices.push_back({o.ns_flops(), MinDim(plan_.tensors(o.tensor()))});
      } else {
        AddNsCalls(o, plan_.tensors(o.tensor()), grad_ == v1::FP32, batched, ns.matrices);
      }
    }
    if (!across) batched.Flush(max_batch, ns.matrices);
    memory_bytes += numel * MuonBytesPerElement(mb.dtype(), grad_);
  }
  batched.Flush(max_batch, ns.matrices);
  const std::string name = RoundName(buckets);
  StepOp ew;
  ew.kind = OpKind::kElementwise;
  ew.phase = Phase::kMuonElementwise;
  ew.rank = rank;
  ew.memory_bytes = memory_bytes;
  ew.calls = calls;
  ew.label = absl::StrCat("muon ", name, " r", rank);
  std::vector<int> block = {p_.AddOp(std::move(ew))};
  const Exchange* ex = nullptr;
  if (exchanges) {
    MUONSHARD_ASSIGN_OR_RETURN(ex, ExchangeOf(rank, exchange_round_of_[rank].at(buckets[0])));
    block.insert(block.end(), ex->before_ns.begin(), ex->before_ns.end());
  }
  if (!ns.matrices.empty()) {
    ns.kind = OpKind::kNewtonSchulz;
    ns.phase = Phase::kNewtonSchulz;
    ns.rank = rank;
    ns.label = absl::StrCat("ns ", name, " r", rank);
    block.push_back(p_.AddOp(std::move(ns)));
  }
  if (ex != nullptr) block.insert(block.end(), ex->after_ns.begin(), ex->after_ns.end());
  return block;
}

// The AdamW buckets of a rank's groups, ascending, with its place in each.
std::vector<std::pair<int, int>> AdamwOfRank(const PlanIndex& x, int rank) {
  std::vector<std::pair<int, int>> out;
  for (const auto& [group, member] : x.rank_groups[rank]) {
    for (const BucketKey& k : x.group_buckets[group]) {
      if (!k.muon) out.push_back({k.index, member});
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Builder::AppendBlock(int lane, const std::vector<int>& block) {
  for (size_t i = 0; i < block.size(); ++i) p_.Append(lane, block[i], i == 0);
}

absl::Status Builder::BuildSequential() {
  for (int r = 0; r < x_.world_size; ++r) {
    lane_of_rank_.push_back(p_.AddLane({"step", {r}, LaneOrder::kInOrder, {}}));
  }
  for (size_t g = 0; g < x_.groups.size(); ++g) {
    if (!Shared(g)) continue;
    for (const BucketKey& k : CommOrder(g)) {
      const int op = ReduceOp(k);
      for (int m : x_.groups[g]) p_.Append(lane_of_rank_[m], op, true);
    }
  }
  for (int r = 0; r < x_.world_size; ++r) {
    // As the worker: the exchange rounds, then the other buckets ascending,
    // batched across them unless the limit is 0 (NOTE [Muon batches]).
    for (const std::vector<int>& round : exchange_rounds_[r]) {
      MUONSHARD_ASSIGN_OR_RETURN(std::vector<int> block, MuonBlock(r, round, false, max_batch_));
      AppendBlock(lane_of_rank_[r], block);
    }
    std::vector<std::vector<int>> blocks;
    for (const auto& [bucket, owned] : x_.owned[r]) {
      if (exchange_round_of_[r].contains(bucket)) continue;
      if (max_batch_ <= 0 || blocks.empty()) blocks.emplace_back();
      blocks.back().push_back(bucket);
    }
    for (const std::vector<int>& buckets : blocks) {
      MUONSHARD_ASSIGN_OR_RETURN(std::vector<int> block, MuonBlock(r, buckets, true, max_batch_));
      AppendBlock(lane_of_rank_[r], block);
    }
    for (const auto& [bucket, member] : AdamwOfRank(x_, r)) {
      AppendBlock(lane_of_rank_[r], {AdamwOp(r, bucket, member)});
    }
  }
  for (size_t g = 0; g < x_.groups.size(); ++g) {
    if (!Shared(g)) continue;
    for (const BucketKey& k : CommOrder(g)) {
      const int op = SyncOp(k, {});
      for (int m : x_.groups[g]) p_.Append(lane_of_rank_[m], op, true);
    }
  }
  return absl::OkStatus();
}

// The rank's Muon updates: its exchange rounds in turn, each once its
// buckets are reduced and after the round before it, then the other buckets
// as they are reduced. Records each bucket's last op in `muon_done`.
absl::Status Builder::PipelinedMuonBlocks(int rank, const std::vector<int>& muon_reduce, std::vector<int>& muon_done) {
  std::vector<std::vector<int>> blocks = exchange_rounds_[rank];
  const size_t rounds = blocks.size();
  for (const auto& [bucket, owned] : x_.owned[rank]) {
    if (!exchange_round_of_[rank].contains(bucket)) blocks.push_back({bucket});
  }
  int previous = -1;
  for (size_t k = 0; k < blocks.size(); ++k) {
    // A bucket at a time (its round's buckets each), as the worker's lanes.
    MUONSHARD_ASSIGN_OR_RETURN(std::vector<int> block, MuonBlock(rank, blocks[k], false, 0));
    std::vector<int>& deps = p_.ops[block[0]].deps;
    for (int bucket : blocks[k]) {
      if (muon_reduce[bucket] >= 0) deps.push_back(muon_reduce[bucket]);
      muon_done[bucket] = block.back();
    }
    if (k < rounds) {
      if (previous >= 0) deps.push_back(previous);
      previous = block.back();
    }
    AppendBlock(lane_of_rank_[rank], block);
  }
  return absl::OkStatus();
}

absl::Status Builder::BuildPipelined() {
  for (int r = 0; r < x_.world_size; ++r) {
    lane_of_rank_.push_back(p_.AddLane({"compute", {r}, LaneOrder::kAsReady, {}}));
  }
  std::vector<int> comm_lane(x_.groups.size(), -1);
  std::vector<int> muon_reduce(plan_.muon_buckets_size(), -1), adamw_reduce(plan_.adamw_buckets_size(), -1);
  for (size_t g = 0; g < x_.groups.size(); ++g) {
    if (!Shared(g) || x_.group_buckets[g].empty()) continue;  // TP groups exchange on the compute lanes
    comm_lane[g] = p_.AddLane({absl::StrCat("comm g", plan_.groups(g).id()), x_.groups[g], LaneOrder::kInOrder, {}});
    for (const BucketKey& k : CommOrder(g)) {
      const int op = ReduceOp(k);
      if (k.muon) {
        for (int b : MovedWith(k)) muon_reduce[b] = op;
      } else {
        adamw_reduce[k.index] = op;
      }
      p_.Append(comm_lane[g], op, true);
    }
  }
  std::vector<int> muon_done(plan_.muon_buckets_size(), -1);
  std::vector<std::vector<int>> adamw_done(plan_.adamw_buckets_size());
  for (int r = 0; r < x_.world_size; ++r) {
    MUONSHARD_RETURN_IF_ERROR(PipelinedMuonBlocks(r, muon_reduce, muon_done));
    for (const auto& [bucket, member] : AdamwOfRank(x_, r)) {
      const int op = AdamwOp(r, bucket, member);
      if (adamw_reduce[bucket] >= 0) p_.ops[op].deps.push_back(adamw_reduce[bucket]);
      adamw_done[bucket].push_back(op);
      AppendBlock(lane_of_rank_[r], {op});
    }
  }
  for (size_t g = 0; g < x_.groups.size(); ++g) {
    if (comm_lane[g] < 0) continue;
    for (const BucketKey& k : CommOrder(g)) {
      std::vector<int> deps = k.muon ? std::vector<int>{} : adamw_done[k.index];
      if (k.muon) {
        for (int b : MovedWith(k)) {
          if (muon_done[b] >= 0) deps.push_back(muon_done[b]);
        }
      }
      p_.Append(comm_lane[g], SyncOp(k, std::move(deps)), true);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepProgram> Builder::Build() {
  p_.name = absl::StrCat("muonshard ", ScheduleName(schedule_));
  p_.world_size = x_.world_size;
  p_.gpus_per_node = x_.gpus_per_node;
  p_.groups = x_.groups;
  OrderExchanges();
  MUONSHARD_RETURN_IF_ERROR(IndexScatterRounds());
  MUONSHARD_RETURN_IF_ERROR(schedule_ == Schedule::kSequential ? BuildSequential() : BuildPipelined());
  return std::move(p_);
}

}  // namespace

absl::StatusOr<StepProgram> BuildPlanProgram(const v1::Plan& plan, Schedule schedule, NsCalls ns_calls,
                                             int64_t muon_batch_mib) {
  MUONSHARD_ASSIGN_OR_RETURN(const PlanIndex index, IndexPlan(plan));
  for (int r = 0; r < index.world_size; ++r) {
    if (index.rank_plan[r] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("plan: rank ", r, " has no RankPlan"));
    }
  }
  return Builder(plan, index, schedule, ns_calls, muon_batch_mib).Build();
}

}  // namespace muonshard::sim
