#include "plan/tp_rounds.h"

#include <algorithm>
#include <numeric>

#include "absl/container/flat_hash_map.h"

namespace muonshard::planner {

std::vector<std::vector<int>> TpExchangeRounds(const std::vector<TpExchangeBucket>& buckets, int tp) {
  std::vector<int> order(buckets.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return buckets[a].last_tensor > buckets[b].last_tensor; });
  std::vector<std::vector<int>> rounds;
  std::vector<bool> covered(std::max(tp, 1), false);
  int uncovered = static_cast<int>(covered.size());
  std::vector<int> round;
  for (int b : order) {
    round.push_back(b);
    for (int t : buckets[b].ns_ranks) {
      if (t < 0) {
        uncovered = 0;
      } else if (t < static_cast<int>(covered.size()) && !covered[t]) {
        covered[t] = true;
        --uncovered;
      }
    }
    if (uncovered > 0) continue;
    rounds.push_back(std::move(round));
    round.clear();
    covered.assign(covered.size(), false);
    uncovered = static_cast<int>(covered.size());
  }
  if (!round.empty()) rounds.push_back(std::move(round));
  return rounds;
}

std::vector<std::vector<int>> TpExchangeRoundsOf(const v1::Plan& plan, const v1::RankPlan& r) {
  auto exchanged = [](const v1::OwnedTensor& o) {
    return o.tp_op() == v1::TP_OP_GATHER_SCATTER || o.tp_op() == v1::TP_OP_ALL_GATHER ||
           o.tp_op() == v1::TP_OP_SHARDED_NS;
  };
  // Most plans exchange nothing (tp = 1): no pass over the plan's buckets.
  if (std::none_of(r.owned().begin(), r.owned().end(), exchanged)) return {};
  absl::flat_hash_map<int, int> position_of_id;
  for (int b = 0; b < plan.muon_buckets_size(); ++b) position_of_id[plan.muon_buckets(b).id()] = b;
  std::vector<std::vector<int>> ns_ranks(plan.muon_buckets_size());
  for (const v1::OwnedTensor& o : r.owned()) {
    if (!exchanged(o)) continue;
    auto it = position_of_id.find(o.bucket());
    if (it == position_of_id.end()) continue;
    ns_ranks[it->second].push_back(o.ns_tp_rank());  // -1: every tp rank (all-gathered, sharded)
  }
  std::vector<TpExchangeBucket> exchanging;
  std::vector<int> position;
  for (int b = 0; b < plan.muon_buckets_size(); ++b) {
    if (ns_ranks[b].empty()) continue;
    int last = -1;
    for (const v1::BucketEntry& e : plan.muon_buckets(b).entries()) last = std::max(last, e.tensor());
    exchanging.push_back({last, std::move(ns_ranks[b])});
    position.push_back(b);
  }
  std::vector<std::vector<int>> rounds = TpExchangeRounds(exchanging, plan.topology().tp());
  for (std::vector<int>& round : rounds) {
    for (int& k : round) k = position[k];
  }
  return rounds;
}

}  // namespace muonshard::planner
