#include "plan/balanced.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <tuple>

#include "plan/node_grid.h"
#include "plan/plan_stats.h"
#include "plan/water_fill.h"

namespace muonshard::planner {
namespace {

// One Muon matrix (or a whole 2-D unit) to place.
struct Item {
  int unit = 0;
  int matrix = 0;
  double flops = 0;
  double bytes = 0;
  double cost = 0;    // normalised size, the greedy's order
  int cls = 0;        // 0: any rank of the stage; e + 1: moe_sharding group e
  int home = 0;       // the class the greedy places it in (see SpreadDense)
  int previous = -1;  // stage-local index of its previous owner, or -1
};

// Places the items of one stage on its n ranks (stage-local index
// i = ms * ep + e, the position in the stage's sharding group).
class StageBalancer {
 public:
  // `flops` and `bytes`: what each rank already holds (the preload).
  // `class_order`: per rank, its place among its moe_sharding group's ranks
  // when their loads tie (empty: by rank; NOTE [Expert owners across
  // nodes]).
  StageBalancer(int n, int ep, double flops_mean, double bytes_mean, std::vector<double> flops,
                std::vector<double> bytes, std::vector<int> class_order)
      : n_(n),
        ep_(ep),
        class_order_(std::move(class_order)),
        inv_f_(flops_mean > 0 ? 1 / flops_mean : 0),
        inv_m_(bytes_mean > 0 ? 1 / bytes_mean : 0),
        base_flops_(flops),
        base_bytes_(bytes),
        flops_(std::move(flops)),
        bytes_(std::move(bytes)),
        items_on_(n),
        version_(n, 0),
        heaps_(ep > 1 ? ep + 1 : 1) {
    for (int i = 0; i < n; ++i) Push(i);
  }

  // Returns the stage-local owner of each item.
  std::vector<int> Place(std::vector<Item>& items) {
    items_ = &items;
    owner_.assign(items.size(), -1);
    pos_.assign(items.size(), 0);
    std::vector<int> order(items.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return items[a].cost > items[b].cost; });
    SpreadDense(order);
    for (int k : order) Add(k, Choose(items[k]));
    Refine();
    return owner_;
  }

 private:
  using Entry = std::tuple<double, int, int, int>;  // (load, order among ties, rank, version)
  using MinHeap = std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>;

  double Load(double f, double m) const { return std::max(f * inv_f_, m * inv_m_); }
  double LoadOf(int i) const { return Load(flops_[i], bytes_[i]); }
  bool Eligible(const Item& it, int i) const { return it.cls == 0 || i % ep_ == it.cls - 1; }

  void Push(int i) {
    heaps_[0].emplace(LoadOf(i), i, i, version_[i]);
    if (ep_ > 1) heaps_[1 + i % ep_].emplace(LoadOf(i), class_order_.empty() ? i : class_order_[i], i, version_[i]);
  }

  // Cross-colour balance at the level of moe_sharding groups: expert load is
  // fixed per group, so each dense matrix (largest first) is homed in the
  // group whose per-rank load it raises least. Placing dense matrices rank by
  // rank before the experts are known would pile them onto groups that then
  // cannot shed expert load.
  void SpreadDense(const std::vector<int>& order) {
    std::vector<Item>& items = *items_;
    for (Item& it : items) it.home = it.cls;
    if (ep_ == 1) return;
    const int ranks_per_group = n_ / ep_;  // ep divides the ranks
    const double per_group = static_cast<double>(ranks_per_group);
    std::vector<double> f(ep_, 0), m(ep_, 0);
    for (const Item& it : items) {
      if (it.cls == 0) continue;
      f[it.cls - 1] += it.flops;
      m[it.cls - 1] += it.bytes;
    }
    for (int k : order) {
      Item& it = items[k];
      if (it.cls != 0) continue;
      int best = 0;
      double best_load = INFINITY;
      for (int e = 0; e < ep_; ++e) {
        const double load = Load((f[e] + it.flops) / per_group, (m[e] + it.bytes) / per_group);
        if (load < best_load) std::tie(best, best_load) = std::make_pair(e, load);
      }
      it.home = best + 1;
      f[best] += it.flops;
      m[best] += it.bytes;
    }
  }

  int Choose(const Item& it) {
    if (it.previous >= 0 && Eligible(it, it.previous) &&
        Load(flops_[it.previous] + it.flops, bytes_[it.previous] + it.bytes) <= kStickySlack) {
      return it.previous;
    }
    MinHeap& heap = heaps_[it.home];
    while (std::get<3>(heap.top()) != version_[std::get<2>(heap.top())]) heap.pop();
    return std::get<2>(heap.top());
  }

  void Add(int k, int i) {
    const Item& it = (*items_)[k];
    flops_[i] += it.flops;
    bytes_[i] += it.bytes;
    owner_[k] = i;
    pos_[k] = static_cast<int>(items_on_[i].size());
    items_on_[i].push_back(k);
    ++version_[i];
    Push(i);
  }

  void Remove(int k) {
    const Item& it = (*items_)[k];
    const int i = owner_[k];
    flops_[i] -= it.flops;
    bytes_[i] -= it.bytes;
    std::vector<int>& on = items_on_[i];
    const int last = on.back();
    on[pos_[k]] = last;
    pos_[last] = pos_[k];
    on.pop_back();
    owner_[k] = -1;
    ++version_[i];
    Push(i);
  }

  // The `count` least-loaded ranks eligible for items of class `cls`.
  std::vector<int> Lightest(int cls, int count) const {
    std::vector<int> ranks;
    for (int i = 0; i < n_; ++i) {
      if (cls == 0 || i % ep_ == cls - 1) ranks.push_back(i);
    }
    count = std::min<int>(count, static_cast<int>(ranks.size()));
    std::partial_sort(ranks.begin(), ranks.begin() + count, ranks.end(),
                      [&](int a, int b) { return std::make_pair(LoadOf(a), a) < std::make_pair(LoadOf(b), b); });
    ranks.resize(count);
    return ranks;
  }

  // Bounded local search: repeatedly move one matrix off the most loaded
  // rank, or swap it with a smaller one, while that lowers the pair's max.
  void Refine() {
    const std::vector<Item>& items = *items_;
    int64_t budget = kRefineBudget;
    for (int iter = 0; iter < 4 * n_ && budget > 0; ++iter) {
      int worst = 0;
      for (int i = 1; i < n_; ++i) {
        if (LoadOf(i) > LoadOf(worst)) worst = i;
      }
      const double top = LoadOf(worst);
      double best = top - 1e-9;
      int best_k = -1, best_t = -1, best_j = -1;
      std::map<int, std::vector<int>> targets;  // by class
      for (int k : items_on_[worst]) {
        if (budget <= 0) break;
        const Item& it = items[k];
        auto [cand, inserted] = targets.try_emplace(it.cls);
        if (inserted) cand->second = Lightest(it.cls, kTargets);
        for (int t : cand->second) {
          if (t == worst) continue;
          const double w = Load(flops_[worst] - it.flops, bytes_[worst] - it.bytes);
          double v = std::max(w, Load(flops_[t] + it.flops, bytes_[t] + it.bytes));
          --budget;
          if (v < best) std::tie(best, best_k, best_t, best_j) = std::make_tuple(v, k, t, -1);
          // Swaps matter when ranks hold few, coarse matrices; with many
          // per rank, moves alone reach fine granularity (and the pair scan
          // would be quadratic).
          if (items_on_[t].size() > kSwapScan || items_on_[worst].size() > kSwapScan) continue;
          for (int j : items_on_[t]) {
            const Item& jt = items[j];
            if (jt.cost >= it.cost || !Eligible(jt, worst)) continue;
            const double vw = Load(flops_[worst] - it.flops + jt.flops, bytes_[worst] - it.bytes + jt.bytes);
            const double vt = Load(flops_[t] + it.flops - jt.flops, bytes_[t] + it.bytes - jt.bytes);
            v = std::max(vw, vt);
            --budget;
            if (v < best) std::tie(best, best_k, best_t, best_j) = std::make_tuple(v, k, t, j);
          }
        }
      }
      if (best_k < 0) {
        // No single move or swap helps: re-split the worst rank's matrices
        // together with a light rank's (k-for-m exchanges, e.g. (4 large +
        // 2 small) + (3 + 3) -> (5 + 0) + (2 + 5) when neither alone fits).
        if (!RepackWorst(worst, budget)) break;
        continue;
      }
      Remove(best_k);
      if (best_j >= 0) {
        Remove(best_j);
        Add(best_j, worst);
      }
      Add(best_k, best_t);
    }
  }

  // Pools the matrices of `worst` with those of each of the lightest ranks
  // of its class in turn and splits the pool again to minimise the pair's
  // max load. Matrices of one (flops, bytes, class) are interchangeable
  // (experts of a stack, same-shape layers), so the split enumerates how
  // many of each kind go to `worst`, bounded by kRepackCombos. Returns
  // whether it lowered the pair's max.
  bool RepackWorst(int worst, int64_t& budget) {
    const std::vector<Item>& items = *items_;
    const double top = LoadOf(worst);
    // Partners: the lightest ranks in worst's moe_sharding group (they can
    // take every class worst holds) and of the whole stage.
    std::vector<int> partners = Lightest(ep_ > 1 ? 1 + worst % ep_ : 0, kTargets);
    for (int t : Lightest(0, kTargets)) partners.push_back(t);
    for (int t : partners) {
      if (t == worst || budget <= 0) continue;
      if (items_on_[worst].size() + items_on_[t].size() > kRepackItems) continue;
      // Kinds in the pool: movable ones (eligible on both ranks) are split;
      // the others stay where they are.
      struct Kind {
        double flops, bytes;
        int cls;
        std::vector<int> members;  // items, those on `worst` first
        int on_worst = 0;
      };
      std::vector<Kind> kinds;
      // What stays: the preload and the matrices that cannot move.
      double fixed_fw = base_flops_[worst], fixed_mw = base_bytes_[worst];
      double fixed_ft = base_flops_[t], fixed_mt = base_bytes_[t];
      for (int r : {worst, t}) {
        for (int k : items_on_[r]) {
          const Item& it = items[k];
          if (!Eligible(it, worst) || !Eligible(it, t)) {
            (r == worst ? fixed_fw : fixed_ft) += it.flops;
            (r == worst ? fixed_mw : fixed_mt) += it.bytes;
            continue;
          }
          auto kind = std::find_if(kinds.begin(), kinds.end(), [&](const Kind& x) {
            return x.flops == it.flops && x.bytes == it.bytes && x.cls == it.cls;
          });
          if (kind == kinds.end()) kind = kinds.insert(kinds.end(), Kind{it.flops, it.bytes, it.cls, {}, 0});
          kind->members.push_back(k);
          if (r == worst) ++kind->on_worst;
        }
      }
      int64_t combos = 1;
      for (const Kind& x : kinds) combos = std::min<int64_t>(combos * (x.members.size() + 1), kRepackCombos + 1);
      if (combos > kRepackCombos) continue;
      budget -= combos;
      // Odometer over counts to `worst`.
      std::vector<int> count(kinds.size(), 0), best_count;
      double best = top - 1e-9;
      while (true) {
        double fw = fixed_fw, mw = fixed_mw, ft = fixed_ft, mt = fixed_mt;
        for (size_t x = 0; x < kinds.size(); ++x) {
          const int rest = static_cast<int>(kinds[x].members.size()) - count[x];
          fw += count[x] * kinds[x].flops;
          mw += count[x] * kinds[x].bytes;
          ft += rest * kinds[x].flops;
          mt += rest * kinds[x].bytes;
        }
        const double v = std::max(Load(fw, mw), Load(ft, mt));
        if (v < best) std::tie(best, best_count) = std::make_pair(v, count);
        size_t x = 0;
        while (x < kinds.size() && ++count[x] > static_cast<int>(kinds[x].members.size())) count[x++] = 0;
        if (x == kinds.size()) break;
      }
      if (best_count.empty()) continue;
      // Apply: keep matrices where they are as far as the counts allow.
      for (size_t x = 0; x < kinds.size(); ++x) {
        int surplus = kinds[x].on_worst - best_count[x];  // > 0: worst gives, < 0: worst takes
        for (int k : kinds[x].members) {
          if (surplus > 0 && owner_[k] == worst) {
            Remove(k);
            Add(k, t);
            --surplus;
          } else if (surplus < 0 && owner_[k] == t) {
            Remove(k);
            Add(k, worst);
            ++surplus;
          }
        }
      }
      return true;
    }
    return false;
  }

  static constexpr double kStickySlack = 1.02;
  static constexpr int kTargets = 8;
  static constexpr size_t kSwapScan = 96;
  static constexpr int64_t kRefineBudget = 4000000;
  static constexpr size_t kRepackItems = 64;
  static constexpr int64_t kRepackCombos = 4096;

  const int n_;
  const int ep_;
  const std::vector<int> class_order_;  // empty: by rank
  const double inv_f_;
  const double inv_m_;
  const std::vector<double> base_flops_;  // the preload
  const std::vector<double> base_bytes_;
  std::vector<double> flops_;
  std::vector<double> bytes_;
  std::vector<std::vector<int>> items_on_;
  std::vector<int> version_;
  std::vector<MinHeap> heaps_;
  std::vector<Item>* items_ = nullptr;
  std::vector<int> owner_;
  std::vector<int> pos_;
};

// The optimizer-state bytes of AdamW unit `u`.
double AdamwUnitStateBytes(const ResolvedModel& model, int u) {
  const Unit& unit = model.units[u];
  return static_cast<double>(unit.numel * AdamwStateBytesPerElem(model.tensors[unit.tensor].dtype));
}

// The Muon matrices of one stage (one pass when per dtype), as items.
std::vector<Item> StageItems(const ResolvedModel& model, const RankLayout& layout, int stage,
                             const std::vector<int>& units, const BalancedOptions& options) {
  std::vector<Item> items;
  for (int u : units) {
    const Unit& unit = model.units[u];
    const ResolvedTensor& t = model.tensors[unit.tensor];
    const int cls = unit.group == layout.DefaultGroup(stage) ? 0 : 1 + (unit.group - layout.pp()) % layout.ep();
    for (int m = unit.matrix_begin; m < unit.matrix_end; ++m) {
      Item it;
      it.unit = u;
      it.matrix = m;
      it.flops = MatrixNsFlops(t, options.ns_steps);
      it.bytes = static_cast<double>(t.rows * t.cols * MuonStateBytesPerElem(t.dtype));
      it.cls = cls;
      if (options.previous_owner != nullptr) {
        auto found = options.previous_owner->find({unit.tensor, m});
        if (found != options.previous_owner->end() && found->second < layout.world_size() &&
            layout.StageOf(found->second) == stage) {
          it.previous = layout.ShardingRankOf(found->second);
        }
      }
      items.push_back(it);
    }
  }
  return items;
}

// A gathered (TP-split) dense matrix: its Newton-Schulz sees more than the
// rank holds. Not one whose blocks align with the split (ns_local): every tp
// rank orthogonalises its own share.
bool Gathered(const ResolvedModel& model, const Item& it) {
  const ResolvedTensor& t = model.tensors[model.units[it.unit].tensor];
  return it.cls == 0 && t.ns_rows * t.ns_cols > t.rows * t.cols && !t.ns_local;
}

// BalancedOptions.dense_runs: the gathered dense items in runs of `size`
// (by FLOPs, then bytes, descending) as one item each, the others alone;
// `members[k]` lists item k's indices into `items`.
std::vector<Item> Runs(const ResolvedModel& model, const std::vector<Item>& items, int size,
                       std::vector<std::vector<int>>& members) {
  std::vector<int> gathered;
  std::vector<Item> out;
  for (int k = 0; k < static_cast<int>(items.size()); ++k) {
    if (Gathered(model, items[k])) {
      gathered.push_back(k);
      continue;
    }
    out.push_back(items[k]);
    members.push_back({k});
  }
  std::stable_sort(gathered.begin(), gathered.end(), [&](int a, int b) {
    return std::make_pair(items[a].flops, items[a].bytes) > std::make_pair(items[b].flops, items[b].bytes);
  });
  for (size_t k = 0; k < gathered.size(); k += size) {
    Item run = items[gathered[k]];
    run.flops = run.bytes = 0;
    members.emplace_back();
    for (size_t j = k; j < std::min(gathered.size(), k + size); ++j) {
      const Item& it = items[gathered[j]];
      run.flops = std::max(run.flops, it.flops);
      run.bytes += it.bytes;
      if (it.previous != run.previous) run.previous = -1;  // sticky: only an owner all members had
      members.back().push_back(gathered[j]);
    }
    out.push_back(run);
  }
  return out;
}

// Each stack's experts are identical, so only the count per owner matters:
// relay them as contiguous ranges (ascending owner; NOTE [Expert owners
// across nodes]: in `class_order`, ExpertClassOrder's), then emit shards.
void EmitShards(const ResolvedModel& model, const RankLayout& layout, const std::vector<Item>& items,
                const std::vector<int>& owner, const std::vector<int>& class_order, std::vector<MuonShard>& shards) {
  size_t k = 0;
  while (k < items.size()) {
    size_t end = k;
    while (end < items.size() && items[end].unit == items[k].unit) ++end;
    std::vector<int> owners(owner.begin() + k, owner.begin() + end);
    const Unit& unit = model.units[items[k].unit];
    const bool moe = unit.group >= layout.pp();
    // A stack's owners are one expert group's: their places in it order them.
    const auto position = [&](int o) { return moe && !class_order.empty() ? class_order[o] : o; };
    std::sort(owners.begin(), owners.end(), [&](int a, int b) { return position(a) < position(b); });
    int first = unit.matrix_begin;
    for (size_t a = 0; a < owners.size();) {
      size_t b = a;
      while (b < owners.size() && owners[b] == owners[a]) ++b;
      const int group_rank = moe ? owners[a] / layout.ep() : owners[a];
      shards.push_back(MuonShard{items[k].unit, first, first + static_cast<int>(b - a), group_rank});
      first += static_cast<int>(b - a);
      a = b;
    }
    k = end;
  }
}

// NOTE [Expert owners across nodes]: the stage-local ranks' order within
// their expert group from its rotation on (empty: none turns).
std::vector<int> ExpertClassOrder(const RankLayout& layout, int stage) {
  const int n = layout.world_size() / layout.pp();
  if (layout.ep() < 2 || layout.gpus_per_node() < 2) return {};
  std::vector<int> order(n);
  bool turned = false;
  for (int e = 0; e < layout.ep(); ++e) {
    const std::vector<int> ranks = layout.GroupRanks(layout.MoeGroup(stage, e));
    const std::vector<int32_t> ranks32(ranks.begin(), ranks.end());
    const int first = ExpertOwnerRotation(ranks32, layout.gpus_per_node(), e);
    const int size = n / layout.ep();
    turned = turned || first != 0;
    for (int ms = 0; ms < size; ++ms) order[ms * layout.ep() + e] = (ms - first + size) % size;
  }
  if (!turned) return {};
  return order;
}

}  // namespace

std::vector<MuonShard> BalancedPartitionMuon(const ResolvedModel& model, const RankLayout& layout,
                                             const BalancedOptions& options) {
  std::vector<MuonShard> shards;
  const int n = layout.world_size() / layout.pp();
  for (int stage = 0; stage < layout.pp(); ++stage) {
    std::vector<int> stage_groups = {layout.DefaultGroup(stage)};
    if (layout.ep() > 1) {
      for (int e = 0; e < layout.ep(); ++e) stage_groups.push_back(layout.MoeGroup(stage, e));
    }
    const std::vector<int> class_order = ExpertClassOrder(layout, stage);
    std::vector<int> units;
    double adamw_bytes = 0;
    for (int g : stage_groups) {
      units.insert(units.end(), model.muon_units[g].begin(), model.muon_units[g].end());
      for (int u : model.adamw_units[g]) adamw_bytes += AdamwUnitStateBytes(model, u);
    }
    std::sort(units.begin(), units.end());
    std::vector<std::vector<int>> passes;
    if (options.per_dtype) {
      for (v1::DType d : {v1::BF16, v1::FP16, v1::FP32}) {
        std::vector<int> subset;
        for (int u : units) {
          if (model.tensors[model.units[u].tensor].dtype == d) subset.push_back(u);
        }
        if (!subset.empty()) passes.push_back(std::move(subset));
      }
    } else if (!units.empty()) {
      passes.push_back(std::move(units));
    }
    for (const std::vector<int>& pass : passes) {
      std::vector<Item> items = StageItems(model, layout, stage, pass, options);
      // What is placed: the items, or with dense_runs the runs and the rest.
      std::vector<std::vector<int>> members;
      std::vector<Item> placed = options.dense_runs > 1 ? Runs(model, items, options.dense_runs, members) : items;
      double flops = 0, bytes = passes.size() == 1 ? adamw_bytes : 0;
      for (const Item& it : placed) {
        flops += it.flops;
        bytes += it.bytes;
      }
      double max_f = 0, max_m = 0;
      for (const Item& it : placed) {
        max_f = std::max(max_f, it.flops);
        max_m = std::max(max_m, it.bytes);
      }
      std::vector<double> base_f(n, 0), base_m(n, 0);
      if (options.preload != nullptr) {
        if (stage < static_cast<int>(options.preload->stage_water_bytes.size())) {
          bytes += options.preload->stage_water_bytes[stage];
        }
        const std::vector<int> ranks = layout.GroupRanks(layout.DefaultGroup(stage));
        for (int i = 0; i < n; ++i) {
          base_f[i] = options.preload->ns_flops[ranks[i]];
          base_m[i] = static_cast<double>(options.preload->state_bytes[ranks[i]]);
          flops += base_f[i];
          bytes += base_m[i];
        }
      }
      // Normalise by the lower bound, so a single huge matrix does not make
      // the greedy ignore the other dimension.
      const double f_target = options.memory_only ? 0 : std::max(flops / n, max_f);
      const double m_target = std::max(bytes / n, max_m);
      for (Item& it : placed) {
        it.cost = (f_target > 0 ? it.flops / f_target : 0) + (m_target > 0 ? it.bytes / m_target : 0);
      }
      StageBalancer balancer(n, layout.ep(), f_target, m_target, std::move(base_f), std::move(base_m), class_order);
      std::vector<int> owner = balancer.Place(placed);
      if (options.dense_runs > 1) {
        std::vector<int> each(items.size());
        for (size_t k = 0; k < members.size(); ++k) {
          for (int j : members[k]) each[j] = owner[k];
        }
        owner = std::move(each);
      }
      EmitShards(model, layout, items, owner, class_order, shards);
    }
  }
  return shards;
}

double AssignmentObjective(const ResolvedModel& model, const RankLayout& layout, const std::vector<MuonShard>& shards,
                           int ns_steps, const Preload* preload) {
  const int w = layout.world_size();
  std::vector<double> flops(w, 0);
  std::vector<int64_t> bytes(w, 0);
  if (preload != nullptr) {
    flops = preload->ns_flops;
    bytes = preload->state_bytes;
  }
  double max_matrix_flops = 0, max_matrix_bytes = 0;
  for (const MuonShard& s : shards) {
    const Unit& u = model.units[s.unit];
    const ResolvedTensor& t = model.tensors[u.tensor];
    const int rank = layout.GroupRanks(u.group)[s.owner];
    const int count = s.matrix_end - s.matrix_begin;
    const double f = MatrixNsFlops(t, ns_steps);
    const int64_t b = t.rows * t.cols * MuonStateBytesPerElem(t.dtype);
    flops[rank] += count * f;
    bytes[rank] += count * b;
    max_matrix_flops = std::max(max_matrix_flops, f);
    max_matrix_bytes = std::max(max_matrix_bytes, static_cast<double>(b));
  }
  double worst = 0;
  for (int stage = 0; stage < layout.pp(); ++stage) {
    const std::vector<int> ranks = layout.GroupRanks(layout.DefaultGroup(stage));
    double water = 0;
    for (int g = 0; g < layout.num_groups(); ++g) {
      if (layout.GroupProto(g).stage() != stage) continue;
      for (int u : model.adamw_units[g]) water += AdamwUnitStateBytes(model, u);
    }
    if (preload != nullptr && stage < static_cast<int>(preload->stage_water_bytes.size())) {
      water += preload->stage_water_bytes[stage];
    }
    std::vector<int64_t> base;
    double total_f = 0, total_b = water, max_f = 0, max_b = 0;
    for (int r : ranks) {
      base.push_back(bytes[r]);
      total_f += flops[r];
      total_b += bytes[r];
      max_f = std::max(max_f, flops[r]);
      max_b = std::max(max_b, static_cast<double>(bytes[r]));
    }
    max_b = std::max(max_b, WaterLevel(base, water));
    const double n = static_cast<double>(ranks.size());
    const double lb_f = std::max(total_f / n, max_matrix_flops);
    const double lb_b = std::max(total_b / n, max_matrix_bytes);
    if (lb_f > 0) worst = std::max(worst, max_f / lb_f);
    if (lb_b > 0) worst = std::max(worst, max_b / lb_b);
  }
  return worst;
}

}  // namespace muonshard::planner
