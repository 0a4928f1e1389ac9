#include "plan/water_fill.h"

#include <algorithm>
#include <cmath>

namespace muonshard::planner {

double WaterLevel(const std::vector<int64_t>& base, double water) {
  // L with sum_i max(0, L - base_i) = water, over the sorted bases.
  std::vector<int64_t> sorted = base;
  std::sort(sorted.begin(), sorted.end());
  const int n = static_cast<int>(sorted.size());
  double below = 0;
  for (int i = 0; i < n; ++i) {
    below += static_cast<double>(sorted[i]);
    const double next = i + 1 < n ? static_cast<double>(sorted[i + 1]) : INFINITY;
    if ((i + 1) * next - below >= water) return (water + below) / (i + 1);
  }
  return n > 0 ? static_cast<double>(sorted.back()) : 0;
}

std::vector<ShardOffsets> WaterFill(const std::vector<int64_t>& bucket_numels, const std::vector<int64_t>& bucket_align,
                                    const std::vector<int64_t>& bucket_state_bytes, std::vector<int64_t>& base_bytes) {
  const int n = static_cast<int>(base_bytes.size());
  if (bucket_numels.empty()) return {};
  // Positions along the concatenated buffers are measured in units of the
  // first bucket's state bytes per element (a bucket's elements weigh its
  // bytes over that), so buckets of one dtype cut exactly by elements.
  const double unit = static_cast<double>(bucket_state_bytes[0]);
  std::vector<double> weight(bucket_numels.size());
  int64_t water = 0;
  double total = 0;
  for (size_t b = 0; b < bucket_numels.size(); ++b) {
    weight[b] = static_cast<double>(bucket_state_bytes[b]) / unit;
    water += bucket_numels[b] * bucket_state_bytes[b];
    total += static_cast<double>(bucket_numels[b]) * weight[b];
  }
  const double level = WaterLevel(base_bytes, static_cast<double>(water));
  // Cumulative quotas (in units), in group-rank order.
  std::vector<double> cut(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    cut[i + 1] = cut[i] + std::max(0.0, level - static_cast<double>(base_bytes[i])) / unit;
  }
  std::vector<ShardOffsets> offsets(bucket_numels.size(), ShardOffsets(n + 1, 0));
  double start = 0;
  for (size_t b = 0; b < bucket_numels.size(); ++b) {
    const int64_t size = bucket_numels[b], align = bucket_align[b];
    const double weighted = static_cast<double>(size) * weight[b];
    for (int i = 0; i <= n; ++i) {
      const double local = std::clamp(cut[i] * total / std::max(cut[n], 1.0) - start, 0.0, weighted) / weight[b];
      int64_t aligned = static_cast<int64_t>(std::llround(local / static_cast<double>(align))) * align;
      aligned = std::clamp<int64_t>(aligned, i == 0 ? 0 : offsets[b][i - 1], size);
      offsets[b][i] = i == n ? size : aligned;
    }
    offsets[b][0] = 0;
    for (int i = 0; i < n; ++i) base_bytes[i] += (offsets[b][i + 1] - offsets[b][i]) * bucket_state_bytes[b];
    start += weighted;
  }
  return offsets;
}

}  // namespace muonshard::planner
