#include "plan/muon_rounds.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace muonshard::planner {
namespace {

// Whether one reduce-scatter of the round beats its reduces to the owners:
// (n - 1) x the largest segment against their sum (NOTE [Muon scatter
// rounds]).
bool ScatterPays(const std::vector<MuonRoundBucket>& buckets, const std::vector<int>& round, int group_size) {
  if (round.size() < 2) return false;
  int64_t largest = 0, sum = 0;
  for (int b : round) {
    largest = std::max(largest, buckets[b].numel);
    sum += buckets[b].numel;
  }
  return static_cast<int64_t>(group_size - 1) * largest < sum;
}

}  // namespace

std::vector<int> RoundPlaces(const std::vector<int>& round_at_place) {
  std::vector<int> out(round_at_place.size(), -1);
  absl::flat_hash_map<int, size_t> last;  // round -> its last place
  for (size_t i = 0; i < round_at_place.size(); ++i) {
    if (round_at_place[i] < 0) continue;
    out[i] = kNoRoundHere;
    last[round_at_place[i]] = i;
  }
  for (const auto& [round, i] : last) out[i] = round;
  return out;
}

int LastTensorOf(const google::protobuf::RepeatedPtrField<v1::BucketEntry>& entries) {
  int last = -1;
  for (const v1::BucketEntry& e : entries) last = std::max(last, e.tensor());
  return last;
}

std::vector<MuonRound> MuonScatterRounds(const std::vector<MuonRoundBucket>& buckets, int group_size) {
  std::vector<int> order(buckets.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return buckets[a].last_tensor > buckets[b].last_tensor; });
  // Round k of a dtype: each owner's k-th bucket of it, in hand-off order.
  std::map<std::pair<int, int>, int> taken;     // (dtype, owner) -> buckets placed so far
  std::map<std::pair<int, int>, int> round_of;  // (dtype, k) -> index into rounds
  std::vector<std::vector<int>> rounds;
  std::vector<int> complete;  // the hand-off place of each round's last bucket
  for (size_t place = 0; place < order.size(); ++place) {
    const MuonRoundBucket& b = buckets[order[place]];
    const int k = taken[{b.dtype, b.owner}]++;
    auto [it, added] = round_of.try_emplace({b.dtype, k}, static_cast<int>(rounds.size()));
    if (added) {
      rounds.emplace_back();
      complete.push_back(0);
    }
    rounds[it->second].push_back(order[place]);
    complete[it->second] = static_cast<int>(place);
  }
  std::vector<int> by_completion(rounds.size());
  for (size_t i = 0; i < by_completion.size(); ++i) by_completion[i] = static_cast<int>(i);
  std::stable_sort(by_completion.begin(), by_completion.end(), [&](int a, int b) { return complete[a] < complete[b]; });
  std::vector<MuonRound> out;
  for (int r : by_completion) {
    MuonRound round;
    round.buckets = rounds[r];
    std::sort(round.buckets.begin(), round.buckets.end(),
              [&](int a, int b) { return std::tie(buckets[a].owner, a) < std::tie(buckets[b].owner, b); });
    round.scatter = group_size > 1 && ScatterPays(buckets, round.buckets, group_size);
    out.push_back(std::move(round));
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<MuonRound>>> MuonScatterRoundsOf(const v1::Plan& plan) {
  std::vector<std::vector<MuonRound>> out(plan.groups_size());
  if (plan.policy().muon_reduce() != v1::MUON_REDUCE_SCATTER_ROUNDS) return out;
  absl::flat_hash_map<int, int> group_of_id;
  for (int g = 0; g < plan.groups_size(); ++g) group_of_id[plan.groups(g).id()] = g;
  std::vector<std::vector<MuonRoundBucket>> of_group(plan.groups_size());
  std::vector<std::vector<int>> position(plan.groups_size());
  for (int b = 0; b < plan.muon_buckets_size(); ++b) {
    const v1::MuonBucket& mb = plan.muon_buckets(b);
    const auto g = group_of_id.find(mb.group());
    if (g == group_of_id.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: Muon bucket ", mb.id(), ": group ", mb.group(), " is not in the plan"));
    }
    const auto& ranks = plan.groups(g->second).ranks();
    const auto owner = std::find(ranks.begin(), ranks.end(), mb.owner());
    if (owner == ranks.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: Muon bucket ", mb.id(), ": owner ", mb.owner(), " is not in group ", mb.group()));
    }
    of_group[g->second].push_back(
        {static_cast<int>(owner - ranks.begin()), LastTensorOf(mb.entries()), mb.dtype(), mb.numel()});
    position[g->second].push_back(b);
  }
  for (int g = 0; g < plan.groups_size(); ++g) {
    if (plan.groups(g).ranks_size() < 2) continue;
    for (MuonRound round : MuonScatterRounds(of_group[g], plan.groups(g).ranks_size())) {
      for (int& b : round.buckets) b = position[g][b];
      out[g].push_back(std::move(round));
    }
  }
  return out;
}

std::vector<ScatterRoundSize> ScatterRoundSizes(const v1::Plan& plan, std::vector<bool>* in_round) {
  in_round->assign(plan.muon_buckets_size(), false);
  std::vector<ScatterRoundSize> out;
  const absl::StatusOr<std::vector<std::vector<MuonRound>>> rounds = MuonScatterRoundsOf(plan);
  if (!rounds.ok()) return out;
  for (int g = 0; g < static_cast<int>(rounds->size()); ++g) {
    for (const MuonRound& round : (*rounds)[g]) {
      if (!round.scatter) continue;
      ScatterRoundSize size{g, 0, plan.muon_buckets(round.buckets[0]).dtype()};
      for (int b : round.buckets) {
        (*in_round)[b] = true;
        size.segment = std::max(size.segment, plan.muon_buckets(b).numel());
      }
      out.push_back(size);
    }
  }
  return out;
}

}  // namespace muonshard::planner
