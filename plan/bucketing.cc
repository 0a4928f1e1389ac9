#include "plan/bucketing.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "plan/model.h"

namespace muonshard::planner {

std::vector<std::vector<int>> AssignGroupBySize(const std::vector<v1::DType>& dtypes,
                                                const std::vector<int64_t>& numels, int64_t limit_bytes) {
  struct Open {
    std::vector<int> items;
    int64_t bytes = 0;
  };
  std::vector<std::vector<int>> closed;
  std::map<int, Open> open;  // by dtype, as the C++ std::map
  for (int i = 0; i < static_cast<int>(numels.size()); ++i) {
    Open& g = open[dtypes[i]];
    g.items.push_back(i);
    g.bytes += numels[i] * DTypeSize(dtypes[i]);
    if (g.bytes >= limit_bytes) {
      closed.push_back(std::move(g.items));
      g = Open();
    }
  }
  for (auto& [dtype, g] : open) {
    if (!g.items.empty()) closed.push_back(std::move(g.items));
  }
  std::sort(closed.begin(), closed.end(),
            [](const std::vector<int>& a, const std::vector<int>& b) { return a[0] < b[0]; });
  return closed;
}

int64_t ReducePaddedNumel(int64_t numel, int esize) {
  int64_t pad_bytes = (kAlignBytes - (numel * esize) % kAlignBytes) % kAlignBytes;
  return numel + pad_bytes / esize;
}

int64_t ReduceScatterPaddedNumel(int64_t numel, int esize, int nranks) {
  int64_t align = (kAlignBytes / esize) * nranks;
  return (numel + align - 1) / align * align;
}

bool DTypeNameLess(v1::DType a, v1::DType b) { return std::strcmp(DTypeName(a), DTypeName(b)) < 0; }

}  // namespace muonshard::planner
