#include "plan/partition.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

#include "plan/bucketing.h"

namespace muonshard::planner {

std::vector<int> SeedGreedy(const std::vector<int64_t>& numels, int group_size, int64_t buffer_mb, bool all_ranks) {
  // Stable sort by numel descending: (-numel, index) pairs sorted in place
  // beat an indirect stable sort over the numel array.
  std::vector<std::pair<int64_t, int>> keyed(numels.size());
  for (size_t i = 0; i < numels.size(); ++i) keyed[i] = {-numels[i], static_cast<int>(i)};
  // Expert groups are often one size throughout, and so already in order.
  if (!std::is_sorted(keyed.begin(), keyed.end())) std::sort(keyed.begin(), keyed.end());
  int64_t total = std::accumulate(numels.begin(), numels.end(), int64_t{0});
  int active = group_size;
  if (!all_ranks) {
    // int(total * 4 / 2^20 / buffer_mb) + 1, computed exactly in integers
    // (the Python float division is exact at these magnitudes).
    int64_t over = total * 4 / ((int64_t{1} << 20) * buffer_mb);
    active = total > 0 ? static_cast<int>(std::min<int64_t>(std::max<int64_t>(1, over + 1), group_size)) : 1;
  }
  // The seed's min(sizes) picks the first least-loaded rank: the heap's
  // (size, rank) order is the same choice in O(log active) instead of a
  // scan over up to 1,024 ranks per tensor.
  using Load = std::pair<int64_t, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> lightest;
  for (int r = 0; r < active; ++r) lightest.emplace(0, r);
  std::vector<int> owner(numels.size(), 0);
  for (const auto& [neg_numel, i] : keyed) {
    auto [size, r] = lightest.top();
    lightest.pop();
    owner[i] = r;
    lightest.emplace(size + numels[i], r);
  }
  return owner;
}

std::vector<MuonShard> SeedPartitionMuon(const ResolvedModel& model, const RankLayout& layout, int64_t buffer_mb,
                                         bool all_ranks, bool per_dtype) {
  std::vector<MuonShard> shards;
  size_t total = 0;
  for (const std::vector<int>& units : model.muon_units) total += units.size();
  shards.reserve(total);
  for (int g = 0; g < layout.num_groups(); ++g) {
    const std::vector<int>& units = model.muon_units[g];
    if (units.empty()) continue;
    int group_size = static_cast<int>(layout.GroupRanks(g).size());
    // Paddle #79740 (`per_dtype`): one pass per dtype in str(dtype) order,
    // each with fresh loads; otherwise one pass over every dtype.
    std::vector<std::vector<int>> passes;
    if (per_dtype) {
      for (v1::DType d : {v1::BF16, v1::FP16, v1::FP32}) {
        std::vector<int> subset;
        for (int u : units) {
          if (model.tensors[model.units[u].tensor].dtype == d) subset.push_back(u);
        }
        if (!subset.empty()) passes.push_back(std::move(subset));
      }
    } else {
      passes.push_back(units);
    }
    for (const std::vector<int>& pass : passes) {
      std::vector<int64_t> numels;
      numels.reserve(pass.size());
      for (int u : pass) numels.push_back(model.units[u].numel);
      std::vector<int> owners = SeedGreedy(numels, group_size, buffer_mb, all_ranks);
      for (size_t i = 0; i < pass.size(); ++i) {
        const Unit& unit = model.units[pass[i]];
        shards.push_back(MuonShard{pass[i], unit.matrix_begin, unit.matrix_end, owners[i]});
      }
    }
  }
  return shards;
}

ShardOffsets EvenShards(int64_t total, int n) {
  ShardOffsets offsets(n + 1);
  for (int i = 0; i <= n; ++i) offsets[i] = total / n * i;
  return offsets;
}

}  // namespace muonshard::planner
