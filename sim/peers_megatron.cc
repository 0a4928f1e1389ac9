// Megatron-LM's Muon strategies as step programs: the layer-wise
// distributed optimizer (whole tensors per DP rank) with each
// --muon-tp-mode (duplicated, distributed, blockwise) and PR #6683's
// layer_sharded exchange.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "sim/internal/peer_job.h"

namespace muonshard::sim::internal {
namespace {

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
  // Newton-Schulz of `ns` on `rank`. layer_sharded as #6683 measured it runs
  // the matrices of one shape as one batched call (--muon-ns-batch-size);
  // the other modes one call per matrix.
  void Ns(int rank, std::vector<NsMatrix> ns) {
    if (mode_ == PeerStrategy::kMegatronLayerSharded) ns = MergeSameShape(ns);
    s_.Ns(rank, std::move(ns), absl::StrCat("ns r", rank));
  }

  // A rank without TP: Newton-Schulz of every owned matrix, then the
  // momentum and apply.
  void Update(int rank, const std::vector<const Matrix*>& muon) {
    std::vector<NsMatrix> ns;
    ns.reserve(muon.size());
    for (const Matrix* m : muon) ns.push_back(m->full);
    Ns(rank, std::move(ns));
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
      for (int i = 0; i < tp; ++i) Ns(members[i], std::exchange(ns[i], {}));
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
          for (int i = 0; i < tp; ++i) ns[i].push_back(m->distributed_step);
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
    for (int i = 0; i < tp; ++i) Ns(members[i], std::exchange(ns[i], {}));
    s_.Collective(OpKind::kAllToAll, Phase::kTpExchange, tp_group, shards, "tp all_to_all back");
    for (int m : members) MuonElementwise(m, owned_[m].muon);
    return absl::OkStatus();
  }

  const Job& job_;
  const PeerStrategy mode_;
  Sequential s_;
  std::vector<Owned> owned_;  // per rank
};

}  // namespace

absl::StatusOr<StepProgram> BuildMegatronProgram(const Job& job, PeerStrategy mode) {
  return Megatron(job, mode).Build();
}

}  // namespace muonshard::sim::internal
