#include "plan/node_grid.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

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

int ExpertOwnerRotation(absl::Span<const int32_t> ranks, int gpus_per_node, int ep_rank) {
  if (gpus_per_node < 2 || ep_rank <= 0) return 0;
  std::vector<int> nodes;  // in order of first appearance (ascending for ascending ranks)
  for (const int32_t rank : ranks) {
    const int node = rank / gpus_per_node;
    if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
  }
  if (nodes.size() < 2) return 0;
  const int target = nodes[ep_rank % nodes.size()];
  for (int g = 0; g < static_cast<int>(ranks.size()); ++g) {
    if (ranks[g] / gpus_per_node == target) return g;
  }
  return 0;
}

}  // namespace muonshard::planner
