// microsoft/dion's (and torchtitan's) Muon as a step program: FSDP
// reduce-scatter, batches of same-shape matrices gathered whole by an
// all-to-all, orthogonalised on one member each, scattered back, overlapped.

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sim/internal/peer_job.h"

namespace muonshard::sim::internal {
namespace {

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

StepProgram BuildAllToAllProgram(const Job& job) { return AllToAll(job).Build(); }

}  // namespace muonshard::sim::internal
