#include "plan/transfer.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "plan/plan_stats.h"

namespace muonshard::planner {
namespace {

struct Piece {
  int64_t begin, end;
  int rank;
  bool operator<(const Piece& o) const { return std::tie(begin, end, rank) < std::tie(o.begin, o.end, o.rank); }
};

// Per tensor index: the element ranges each rank holds state for.
std::vector<std::vector<Piece>> Ownership(const v1::Plan& plan) {
  std::vector<std::vector<Piece>> pieces(plan.tensors_size());
  for (const v1::RankPlan& r : plan.ranks()) {
    for (const v1::OwnedTensor& o : r.owned()) {
      const v1::PlannedTensor& t = plan.tensors(o.tensor());
      const int64_t per = t.shape(t.shape_size() - 1) * t.shape(t.shape_size() - 2);
      pieces[o.tensor()].push_back({o.matrix_begin() * per, o.matrix_end() * per, r.rank()});
    }
    for (const v1::TensorSlice& s : r.slices()) pieces[s.tensor()].push_back({s.begin(), s.end(), r.rank()});
  }
  for (auto& p : pieces) std::sort(p.begin(), p.end());
  return pieces;
}

}  // namespace

absl::StatusOr<TransferSummary> ComputeTransfers(const v1::Plan& from, const v1::Plan& to) {
  absl::flat_hash_map<std::string, int> old_index;
  for (int i = 0; i < from.tensors_size(); ++i) old_index[from.tensors(i).name()] = i;
  const auto old_pieces = Ownership(from);
  const auto new_pieces = Ownership(to);
  std::map<std::pair<int, int>, int64_t> pairs;
  TransferSummary summary;
  for (int i = 0; i < to.tensors_size(); ++i) {
    const v1::PlannedTensor& t = to.tensors(i);
    auto found = old_index.find(t.name());
    if (found == old_index.end() || from.tensors(found->second).numel() != t.numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name(),
                       "\": ", found == old_index.end() ? "not in the old plan" : "has another size in the old plan"));
    }
    const int64_t per_elem = CheckpointStateBytesPerElem(t.optimizer());
    const std::vector<Piece>& olds = old_pieces[found->second];
    size_t k = 0;
    for (const Piece& n : new_pieces[i]) {
      while (k < olds.size() && olds[k].end <= n.begin) ++k;
      for (size_t j = k; j < olds.size() && olds[j].begin < n.end; ++j) {
        const int64_t overlap = std::min(n.end, olds[j].end) - std::max(n.begin, olds[j].begin);
        if (overlap > 0) pairs[{olds[j].rank, n.rank}] += overlap * per_elem;
      }
      summary.state_bytes += (n.end - n.begin) * per_elem;
    }
  }
  for (const auto& [key, bytes] : pairs) {
    summary.transfers.push_back({key.first, key.second, bytes});
    if (key.first != key.second) summary.moved_bytes += bytes;
  }
  return summary;
}

}  // namespace muonshard::planner
