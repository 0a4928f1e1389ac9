#include "plan/ns_batches.h"

#include <algorithm>
#include <map>

namespace muonshard::planner {

int64_t MuonBatchElements(int64_t mib) { return std::max<int64_t>(0, mib) * (int64_t{1} << 20) / 4; }

std::vector<std::vector<int>> NsBatches(absl::Span<const NsBatchItem> items, int64_t max_elements) {
  struct Open {
    int batch = -1;  // index in `out`
    int64_t elements = 0;
  };
  std::vector<std::vector<int>> out;
  std::map<NsBatchKey, Open> open;
  for (int i = 0; i < static_cast<int>(items.size()); ++i) {
    Open& o = open[items[i].key];
    const bool full = max_elements > 0 && o.elements + items[i].elements > max_elements;
    if (o.batch < 0 || full) {
      o = {static_cast<int>(out.size()), 0};
      out.emplace_back();
    }
    out[o.batch].push_back(i);
    o.elements += items[i].elements;
  }
  return out;
}

}  // namespace muonshard::planner
