#include "plan/tp_rounds.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"

namespace muonshard::planner {
namespace {

using Item = std::pair<int, double>;  // an NsRoundBucket's gathered matrix

// Gathered matrices binned for one round: `before` the round's last bucket
// over the first `before_bins` bins, then the last bucket's over all of
// them, each largest first onto the least-loaded bin (LPT).
struct Binning {
  std::vector<std::vector<int>> bins;
  std::vector<double> load;
  int covered_before = 0;  // bins holding a matrix of a bucket before the last
  int covered = 0;         // bins holding any matrix

  Binning(std::vector<Item> before, std::vector<Item> last, int tp, int before_bins) : bins(tp), load(tp, 0) {
    Place(std::move(before), before_bins);
    for (int b = 0; b < tp; ++b) covered_before += bins[b].empty() ? 0 : 1;
    Place(std::move(last), tp);
    for (int b = 0; b < tp; ++b) covered += bins[b].empty() ? 0 : 1;
  }

  void Place(std::vector<Item> items, int num_bins) {
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.second > b.second; });
    for (const auto& [id, flops] : items) {
      const int b = static_cast<int>(std::min_element(load.begin(), load.begin() + num_bins) - load.begin());
      load[b] += flops;
      bins[b].push_back(id);
    }
  }

  double Longest() const { return *std::max_element(load.begin(), load.end()); }
};

// Whether TpExchangeRounds closes the round [begin, end) binned as `b` at
// its last bucket (or, for the step's last round, not before it).
bool ClosesAtEnd(const Binning& b, bool covers_all, bool last_round, int tp) {
  if (b.covered_before == tp) return false;  // closed before its last bucket
  return covers_all || last_round || b.covered == tp;
}

struct Cut {
  double flops = std::numeric_limits<double>::infinity();
  int begin = -1;
  std::vector<std::vector<int>> bins;
};

// The best binning of the round [begin, end): all its matrices LPT over the
// tp bins, or those before its last bucket over tp - 1 bins (the last
// bucket's then open the last bin), whichever is shorter of those that
// close at its end; none (infinite FLOPs) if neither does. The second
// always does for a round closed by a matrix every rank runs and for the
// step's last round.
Cut CutRound(const std::vector<NsRoundBucket>& buckets, int begin, int end, int tp) {
  const NsRoundBucket& last = buckets[end - 1];
  std::vector<Item> before;
  double every_rank = last.every_rank;
  for (int k = begin; k + 1 < end; ++k) {
    before.insert(before.end(), buckets[k].gathered.begin(), buckets[k].gathered.end());
    every_rank += buckets[k].every_rank;
  }
  const bool last_round = end == static_cast<int>(buckets.size());
  Cut best;
  for (int before_bins : {tp, tp - 1}) {
    Binning b(before, last.gathered, tp, before_bins);
    if (!ClosesAtEnd(b, last.covers_all, last_round, tp)) continue;
    const double flops = b.Longest() + every_rank;
    if (flops < best.flops) best = {flops, begin, std::move(b.bins)};
  }
  return best;
}

}  // namespace

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

std::vector<NsRound> PlanNsRounds(const std::vector<NsRoundBucket>& buckets, int tp, int max_round_buckets) {
  const int n = static_cast<int>(buckets.size());
  // sum[i]: the least sum over rounds cutting buckets [0, i); last[i]: its last round.
  std::vector<double> sum(n + 1, std::numeric_limits<double>::infinity());
  std::vector<Cut> last(n + 1);
  sum[0] = 0;
  for (int end = 1; end <= n; ++end) {
    // The last round may reach back to the first bucket: every cut ends.
    for (int begin = end - 1; begin >= 0 && (end - begin <= max_round_buckets || end == n); --begin) {
      if (begin < end - 1 && buckets[begin].covers_all) break;  // it closes a round before `end`
      if (sum[begin] == std::numeric_limits<double>::infinity()) continue;
      Cut cut = CutRound(buckets, begin, end, tp);
      if (sum[begin] + cut.flops < sum[end]) {
        sum[end] = sum[begin] + cut.flops;
        last[end] = std::move(cut);
      }
    }
  }
  std::vector<NsRound> rounds;
  for (int end = n; end > 0; end = last[end].begin) {
    NsRound round{last[end].begin, end, {}};
    for (std::vector<int>& bin : last[end].bins) {
      if (!bin.empty()) round.bins.push_back(std::move(bin));
    }
    rounds.push_back(std::move(round));
  }
  std::reverse(rounds.begin(), rounds.end());
  return rounds;
}

}  // namespace muonshard::planner
