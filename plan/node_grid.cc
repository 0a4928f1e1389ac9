#include "plan/node_grid.h"

#include <map>
#include <utility>

namespace muonshard::planner {

std::vector<std::vector<int>> NodeGridOf(absl::Span<const int32_t> ranks, int gpus_per_node) {
  if (gpus_per_node < 2) return {};
  std::map<int, std::vector<int>> by_node;  // node -> group ranks on it, in group-rank order
  for (int g = 0; g < static_cast<int>(ranks.size()); ++g) by_node[ranks[g] / gpus_per_node].push_back(g);
  if (by_node.size() < 2) return {};
  const size_t per_node = by_node.begin()->second.size();
  if (per_node < 2) return {};
  std::vector<std::vector<int>> grid;
  grid.reserve(by_node.size());
  for (auto& [node, members] : by_node) {
    if (members.size() != per_node) return {};
    grid.push_back(std::move(members));
  }
  return grid;
}

}  // namespace muonshard::planner
