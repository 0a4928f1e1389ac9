// The data-parallel peers as step programs: KellerJordan/Muon's round-robin
// all_gather after a DDP all-reduce, and DeepSpeed's ZeRO-1 Muon (flat
// partitions, whole matrices on every rank a partition touches).

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sim/internal/peer_job.h"
#include "sim/plan_program.h"

namespace muonshard::sim::internal {

// ---- KellerJordan/Muon: DDP all-reduce, round-robin all_gather ------------

StepProgram BuildRoundRobinProgram(const Job& job) {
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

StepProgram BuildZero1Program(const Job& job) {
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

}  // namespace muonshard::sim::internal
