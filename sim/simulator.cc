#include "sim/simulator.h"

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "sim/cost_model.h"

namespace muonshard::sim {
namespace {

// ---- costs

struct OpCost {
  double seconds = 0;
  std::string algorithm;
  // Wire bytes each member sends, per link class: one row for everyone
  // (symmetric collectives) or one per member (gather / scatter by member).
  std::vector<std::array<double, kLinkClassCount>> sent;
};

bool HasMemberBytes(const StepOp& op) { return !op.member_send.empty() || !op.member_recv.empty(); }

int64_t MemberBytes(const std::vector<int64_t>& v, size_t i) { return v.empty() ? 0 : v[i]; }

// A gather or scatter with per-member bytes: priced by its root's links.
OpCost RootCentricCost(const ClusterSpec& c, const StepOp& op, const std::vector<int>& members) {
  const bool gather = op.kind == OpKind::kGather;
  const int root_node = NodeOf(c, members[op.root]);
  std::array<double, kLinkClassCount> total{};
  bool crosses = false;
  OpCost cost;
  cost.sent.assign(members.size(), {});
  for (size_t i = 0; i < members.size(); ++i) {
    if (static_cast<int>(i) == op.root) continue;
    const int cls = NodeOf(c, members[i]) == root_node ? 0 : 1;
    crosses = crosses || cls == 1;
    const double b = static_cast<double>(gather ? MemberBytes(op.member_send, i) : MemberBytes(op.member_recv, i));
    total[cls] += b;
    (gather ? cost.sent[i][cls] : cost.sent[op.root][cls]) += b;
  }
  const LinkSpec& first = crosses ? c.inter_node : c.intra_node;
  cost.seconds = c.collective_base_us * 1e-6 + first.LatencySeconds() +
                 std::max(total[0] / c.intra_node.BytesPerSecond(), total[1] / c.inter_node.BytesPerSecond());
  cost.algorithm = c.library == CollectiveLibrary::kGloo ? "gloo" : "p2p";
  return cost;
}

// The gathers and scatters of one group call on an NCCL cluster
// (StepOp::call_group): every member sends and receives its share of all of
// them at once, so the call lasts as long as the busiest member's busiest
// link direction takes, one latency for all.
double GroupCallSeconds(const ClusterSpec& c, const StepProgram& p, const std::vector<int>& ops) {
  const std::vector<int>& members = p.groups[p.ops[ops[0]].group];
  std::vector<std::array<double, kLinkClassCount>> send(members.size()), recv(members.size());
  bool crosses = false;
  for (int index : ops) {
    const StepOp& op = p.ops[index];
    const int root_node = NodeOf(c, members[op.root]);
    for (size_t i = 0; i < members.size(); ++i) {
      if (static_cast<int>(i) == op.root) continue;
      const int cls = NodeOf(c, members[i]) == root_node ? 0 : 1;
      crosses = crosses || cls == 1;
      if (op.kind == OpKind::kGather) {
        const double b = static_cast<double>(MemberBytes(op.member_send, i));
        send[i][cls] += b;
        recv[op.root][cls] += b;
      } else {
        const double b = static_cast<double>(MemberBytes(op.member_recv, i));
        send[op.root][cls] += b;
        recv[i][cls] += b;
      }
    }
  }
  const double bandwidth[kLinkClassCount] = {c.intra_node.BytesPerSecond(), c.inter_node.BytesPerSecond()};
  double busiest = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    for (int cls = 0; cls < kLinkClassCount; ++cls) {
      busiest = std::max(busiest, std::max(send[i][cls], recv[i][cls]) / bandwidth[cls]);
    }
  }
  const LinkSpec& first = crosses ? c.inter_node : c.intra_node;
  return c.collective_base_us * 1e-6 + first.LatencySeconds() + busiest;
}

// NCCL: each group call's cost on its first op, none on the others (their
// wire bytes stay theirs). Gloo runs the ops of a group call one by one.
void PriceGroupCalls(const ClusterSpec& c, const StepProgram& p, std::vector<OpCost>& costs) {
  if (c.library == CollectiveLibrary::kGloo) return;
  std::map<int, std::vector<int>> ops_of_call;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    if (p.ops[i].call_group >= 0) ops_of_call[p.ops[i].call_group].push_back(static_cast<int>(i));
  }
  for (const auto& [call, ops] : ops_of_call) {
    if (p.groups[p.ops[ops[0]].group].size() < 2) continue;
    costs[ops[0]].seconds = GroupCallSeconds(c, p, ops);
    costs[ops[0]].algorithm = "p2p group";
    for (size_t k = 1; k < ops.size(); ++k) costs[ops[k]].seconds = 0;
  }
}

OpCost CostOf(const ClusterSpec& c, const StepProgram& p, const std::vector<GroupShape>& shapes, const StepOp& op) {
  OpCost cost;
  switch (op.kind) {
    case OpKind::kNewtonSchulz:
      cost.seconds = NewtonSchulzSeconds(c, op.matrices);
      return cost;
    case OpKind::kElementwise:
      cost.seconds = ElementwiseSeconds(c, op.memory_bytes, op.calls, op.phase == Phase::kAdamwElementwise);
      return cost;
    case OpKind::kFixed:
      cost.seconds = op.seconds;
      return cost;
    default:
      break;
  }
  const std::vector<int>& members = p.groups[op.group];
  if (members.size() < 2) return cost;
  if ((op.kind == OpKind::kGather || op.kind == OpKind::kScatter) && HasMemberBytes(op)) {
    return RootCentricCost(c, op, members);
  }
  const CollectiveCost cc = CostOfCollective(c, op.kind, shapes[op.group], static_cast<double>(op.bytes));
  cost.seconds = cc.seconds;
  cost.algorithm = cc.algorithm;
  if (IsGlooFlat(c, op.kind, shapes[op.group])) {  // which hops cross depends on where each member sits
    std::vector<int> nodes;
    nodes.reserve(members.size());
    for (int rank : members) nodes.push_back(NodeOf(c, rank));
    cost.sent = GlooFlatSent(op.kind, nodes, op.root, static_cast<double>(op.bytes));
  } else {
    cost.sent.push_back(cc.bytes_sent);
  }
  return cost;
}

// ---- the host's CPU (NOTE [Host CPU] in sim/cluster.h)

// The wire bytes member `m` sends per link class (REQUIRES: cost.sent not
// empty): one row for everyone, or one per member.
const std::array<double, kLinkClassCount>& SentRow(const OpCost& cost, size_t m) {
  return cost.sent.size() == 1 ? cost.sent[0] : cost.sent[m];
}

// The bytes member `m` of a collective moves: what it sends or receives,
// the larger.
double MovedBytes(const StepProgram& p, const StepOp& op, const OpCost& cost, size_t m) {
  double sent = 0;
  if (!cost.sent.empty()) {
    for (double b : SentRow(cost, m)) sent += b;
  }
  if (!HasMemberBytes(op)) return sent;  // symmetric: each member receives what it sends
  double received = static_cast<double>(MemberBytes(op.member_recv, m));
  if (op.kind == OpKind::kGather && static_cast<int>(m) == op.root) {
    for (size_t i = 0; i < p.groups[op.group].size(); ++i) {
      if (static_cast<int>(i) != op.root) received += static_cast<double>(MemberBytes(op.member_send, i));
    }
  }
  return std::max(sent, received);
}

// Loads on a shared resource (a rank's CPU, a node's link): while each
// runs, it takes `fraction` of the resource.
struct Load {
  double start, end, fraction;
};

// When `work` seconds of the whole resource, started at `start`, end in
// what `loads` leave of it: between two of their starts and ends the work
// runs at 1 - (their sum, at most 1).
double EndInWhatIsLeft(const std::vector<Load>& loads, double start, double work) {
  std::vector<std::pair<double, double>> steps;  // (time, change of the fraction)
  double fraction = 0;
  for (const Load& l : loads) {
    if (l.end <= start) continue;
    if (l.start <= start) {
      fraction += l.fraction;
    } else {
      steps.emplace_back(l.start, l.fraction);
    }
    steps.emplace_back(l.end, -l.fraction);
  }
  std::sort(steps.begin(), steps.end());
  double t = start, left = work;
  for (const auto& [at, change] : steps) {
    const double rate = std::max(0.0, 1.0 - fraction);
    if (rate > 0 && left <= rate * (at - t)) return t + left / rate;
    left -= rate * (at - t);
    t = at;
    fraction += change;
  }
  return t + left;  // past the last load: the whole resource
}

// A node's link, one way: 2 · node for what leaves it, 2 · node + 1 for
// what enters it.
int NodeLinkOut(int node) { return 2 * node; }
int NodeLinkIn(int node) { return 2 * node + 1; }

// NOTE [Shared node links]: the bytes collective `op` moves through each
// node's link, each way. A reduce (gather) sends everything crossing into
// its root's node, a broadcast (scatter) out of it; the others send from
// and receive at every member what it sends.
std::map<int, double> NodeLinkBytes(const StepProgram& p, const ClusterSpec& c, const StepOp& op, const OpCost& cost) {
  std::map<int, double> bytes;
  if (cost.sent.empty()) return bytes;
  const std::vector<int>& members = p.groups[op.group];
  const auto sent = [&](size_t m) { return SentRow(cost, m)[static_cast<int>(LinkClass::kInterNode)]; };
  const bool to_root = op.kind == OpKind::kReduce || op.kind == OpKind::kGather;
  const bool from_root = op.kind == OpKind::kBroadcast || op.kind == OpKind::kScatter;
  if (!to_root && !from_root) {
    for (size_t m = 0; m < members.size(); ++m) {
      bytes[NodeLinkOut(NodeOf(c, members[m]))] += sent(m);
      bytes[NodeLinkIn(NodeOf(c, members[m]))] += sent(m);
    }
    return bytes;
  }
  const int root_node = NodeOf(c, members[op.root]);
  double total = 0;
  int others = 0;
  for (size_t m = 0; m < members.size(); ++m) {
    total += sent(m);
    others += NodeOf(c, members[m]) != root_node;
  }
  if (others == 0) return bytes;
  bytes[to_root ? NodeLinkIn(root_node) : NodeLinkOut(root_node)] += total;
  for (int rank : members) {
    const int node = NodeOf(c, rank);
    if (node != root_node) bytes[to_root ? NodeLinkOut(node) : NodeLinkIn(node)] += total / others;
  }
  return bytes;
}

// NOTE [Host CPU] and NOTE [Shared node links] in sim/cluster.h: what the
// collectives take of the ranks' CPUs and of the nodes' links, booked as
// they start.
class Contention {
 public:
  Contention(const StepProgram& p, const ClusterSpec& c, const std::vector<OpCost>& costs);

  bool enabled() const { return enabled_; }
  // Collective `op` starts at `start` and would take `seconds` alone: its
  // end, its link time run in what earlier collectives leave of its nodes'
  // links; books its loads.
  double StartCollective(int op, double start, double seconds);
  // The ranks whose CPU collective `op` takes a share of.
  const std::vector<std::pair<int, double>>& CpuSharesOf(int op) const { return cpu_seconds_[op]; }
  // When `seconds` of compute on `rank` started at `start` end, in what the
  // collectives booked so far leave of the rank's CPU.
  double ComputeEnd(int rank, double start, double seconds) const {
    return EndInWhatIsLeft(cpu_loads_[rank], start, seconds);
  }

 private:
  bool enabled_ = false;
  // Per collective: (rank, CPU seconds) of each member it takes time from,
  // and (node link one way, its seconds) of each node link it uses.
  std::vector<std::vector<std::pair<int, double>>> cpu_seconds_;
  std::vector<std::vector<std::pair<int, double>>> link_seconds_;
  std::vector<std::vector<Load>> cpu_loads_;   // per rank
  std::vector<std::vector<Load>> link_loads_;  // per node link one way (NodeLinkOut, NodeLinkIn)
};

Contention::Contention(const StepProgram& p, const ClusterSpec& c, const std::vector<OpCost>& costs)
    : cpu_seconds_(p.ops.size()),
      link_seconds_(p.ops.size()),
      cpu_loads_(p.world_size),
      link_loads_(2 * NodesUsed(c, p.world_size)) {
  const double cpu_rate = c.host_collective_gb_s * 1e9;
  const double link_rate = c.inter_node.BytesPerSecond();
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const StepOp& op = p.ops[i];
    if (!IsCollective(op.kind) || p.groups[op.group].size() < 2) continue;
    const std::vector<int>& members = p.groups[op.group];
    for (size_t m = 0; m < members.size(); ++m) {
      const double bytes = MovedBytes(p, op, costs[i], m);
      if (cpu_rate > 0 && bytes > 0) cpu_seconds_[i].emplace_back(members[m], bytes / cpu_rate);
    }
    if (c.inter_node_shared) {
      for (const auto& [direction, bytes] : NodeLinkBytes(p, c, op, costs[i])) {
        if (bytes > 0) link_seconds_[i].emplace_back(direction, bytes / link_rate);
      }
    }
    enabled_ = enabled_ || !cpu_seconds_[i].empty() || !link_seconds_[i].empty();
  }
}

double Contention::StartCollective(int op, double start, double seconds) {
  double end = start + seconds;
  for (const auto& [way, link] : link_seconds_[op]) {
    const double alone = std::min(link, seconds);
    end = std::max(end, EndInWhatIsLeft(link_loads_[way], start, alone) + (seconds - alone));
  }
  if (end <= start) return end;
  const double duration = end - start;
  for (const auto& [rank, cpu] : cpu_seconds_[op])
    cpu_loads_[rank].push_back({start, end, std::min(1.0, cpu / duration)});
  for (const auto& [way, link] : link_seconds_[op])
    link_loads_[way].push_back({start, end, std::min(1.0, link / duration)});
  return end;
}

// ---- the event simulation

struct Where {
  int lane;
  int block;
  int pos;
};

class Engine {
 public:
  // `lanes`: the program's, and the simulator's own (link lanes).
  Engine(const StepProgram& p, const std::vector<Lane>& lanes, const std::vector<OpCost>& costs,
         Contention& contention);
  absl::Status Run();
  std::vector<OpTiming>& timing() { return timing_; }

 private:
  using Entry = std::tuple<double, double, int>;  // start, dependencies' end, op

  bool LaneAllows(const Where& w) const;
  // `op` waits for as-ready `lane` to finish another block.
  void WaitFor(int lane, int op);
  bool Eligible(int op);
  double Start(int op) const;
  void TryPush(int op);
  void Schedule(int op);
  int Pred(int op, double start) const;
  void Occupy(const Where& w, int op, double end);
  void LaneMoved(int lane);
  // NOTE [Host CPU], NOTE [Shared node links]: the end of `op` as the
  // ranks' CPUs and the nodes' links allow it.
  double EndOf(int op, double start);
  // Collective `op` started: the compute ops running on its members' CPUs
  // end later.
  void SlowRunningCompute(int op, double start);
  void MoveEnd(int op, double end);

  const StepProgram& p_;
  const std::vector<Lane>& lanes_;
  const std::vector<OpCost>& costs_;
  Contention& contention_;
  std::vector<std::vector<int>> computing_;  // per rank: compute ops that may still run
  std::vector<OpTiming> timing_;
  std::vector<std::vector<Where>> where_;
  std::vector<std::vector<int>> dependents_;
  std::vector<int> missing_;
  std::vector<double> deps_end_;
  std::vector<int> dep_pred_;
  std::vector<char> done_;
  std::vector<char> queued_;    // in the heap (its entry is checked when popped)
  std::vector<int> scan_from_;  // per op: where in where_[op] a lane last held it back
  std::vector<double> lane_free_;
  std::vector<int> lane_block_;  // the running block, -1 when free
  std::vector<int> lane_pos_;
  std::vector<int> lane_next_;  // in-order lanes: the next block
  std::vector<int> lane_last_;  // the last op run
  std::vector<std::vector<char>> started_;
  // As-ready lanes: the ops held back by the block running there, to check
  // again when it ends; per op the lane it is listed on (-1: none).
  std::vector<std::vector<int>> waiting_;
  std::vector<int> waiting_on_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
};

Engine::Engine(const StepProgram& p, const std::vector<Lane>& lanes, const std::vector<OpCost>& costs,
               Contention& contention)
    : p_(p),
      lanes_(lanes),
      costs_(costs),
      contention_(contention),
      computing_(p.world_size),
      timing_(p.ops.size()),
      where_(p.ops.size()),
      dependents_(p.ops.size()),
      missing_(p.ops.size(), 0),
      deps_end_(p.ops.size(), 0),
      dep_pred_(p.ops.size(), -1),
      done_(p.ops.size(), 0),
      queued_(p.ops.size(), 0),
      scan_from_(p.ops.size(), 0),
      lane_free_(lanes.size(), 0),
      lane_block_(lanes.size(), -1),
      lane_pos_(lanes.size(), 0),
      lane_next_(lanes.size(), 0),
      lane_last_(lanes.size(), -1),
      started_(lanes.size()),
      waiting_(lanes.size()),
      waiting_on_(p.ops.size(), -1) {
  for (size_t l = 0; l < lanes.size(); ++l) {
    const std::vector<std::vector<int>>& blocks = lanes[l].blocks;
    started_[l].assign(blocks.size(), 0);
    for (size_t b = 0; b < blocks.size(); ++b) {
      for (size_t i = 0; i < blocks[b].size(); ++i) {
        where_[blocks[b][i]].push_back({static_cast<int>(l), static_cast<int>(b), static_cast<int>(i)});
      }
    }
  }
  for (size_t op = 0; op < p.ops.size(); ++op) {
    for (int d : p.ops[op].deps) {
      dependents_[d].push_back(static_cast<int>(op));
      ++missing_[op];
    }
  }
}

bool Engine::LaneAllows(const Where& w) const {
  if (lane_block_[w.lane] >= 0) return lane_block_[w.lane] == w.block && lane_pos_[w.lane] == w.pos;
  if (w.pos != 0 || started_[w.lane][w.block]) return false;
  return lanes_[w.lane].order != LaneOrder::kInOrder || lane_next_[w.lane] == w.block;
}

void Engine::WaitFor(int lane, int op) {
  if (waiting_on_[op] == lane) return;
  waiting_on_[op] = lane;
  waiting_[lane].push_back(op);
}

// Lanes are checked from the one that last held the op back: a collective
// on n lanes costs O(n) checks in all as its lanes reach it one by one, not
// O(n) per lane.
bool Engine::Eligible(int op) {
  if (done_[op] || missing_[op] > 0) return false;
  const std::vector<Where>& where = where_[op];
  const size_t n = where.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (scan_from_[op] + k) % n;
    const Where& w = where[i];
    if (!LaneAllows(w)) {
      scan_from_[op] = static_cast<int>(i);
      if (lanes_[w.lane].order == LaneOrder::kAsReady && lane_block_[w.lane] >= 0 && lane_block_[w.lane] != w.block) {
        WaitFor(w.lane, op);
      }
      return false;
    }
  }
  return true;
}

double Engine::Start(int op) const {
  double start = deps_end_[op];
  for (const Where& w : where_[op]) start = std::max(start, lane_free_[w.lane]);
  return start;
}

void Engine::TryPush(int op) {
  if (queued_[op] || !Eligible(op)) return;
  heap_.emplace(Start(op), deps_end_[op], op);
  queued_[op] = 1;
}

int Engine::Pred(int op, double start) const {
  if (start <= 0) return -1;
  if (dep_pred_[op] >= 0 && deps_end_[op] >= start) return dep_pred_[op];
  for (const Where& w : where_[op]) {
    if (lane_last_[w.lane] >= 0 && lane_free_[w.lane] >= start) return lane_last_[w.lane];
  }
  return -1;
}

void Engine::Occupy(const Where& w, int op, double end) {
  if (lane_block_[w.lane] < 0) {
    lane_block_[w.lane] = w.block;
    lane_pos_[w.lane] = 0;
    started_[w.lane][w.block] = 1;
  }
  ++lane_pos_[w.lane];
  lane_free_[w.lane] = end;
  lane_last_[w.lane] = op;
  if (lane_pos_[w.lane] == static_cast<int>(lanes_[w.lane].blocks[w.block].size())) {
    lane_block_[w.lane] = -1;
    lane_next_[w.lane] = w.block + 1;
  }
}

double Engine::EndOf(int op, double start) {
  const StepOp& o = p_.ops[op];
  if (!contention_.enabled()) return start + costs_[op].seconds;
  if (IsCollective(o.kind)) {
    const double end = contention_.StartCollective(op, start, costs_[op].seconds);
    SlowRunningCompute(op, start);
    return end;
  }
  std::vector<int>& running = computing_[o.rank];
  running.erase(std::remove_if(running.begin(), running.end(), [&](int c) { return timing_[c].end <= start; }),
                running.end());
  running.push_back(op);
  return contention_.ComputeEnd(o.rank, start, costs_[op].seconds);
}

void Engine::SlowRunningCompute(int op, double start) {
  for (const auto& [rank, seconds] : contention_.CpuSharesOf(op)) {
    for (int c : computing_[rank]) {
      if (!done_[c] || timing_[c].end <= start) continue;
      MoveEnd(c, contention_.ComputeEnd(rank, timing_[c].start, costs_[c].seconds));
    }
  }
}

// Nothing that waits for `op` has started yet (ops start in time order and
// `op` is still running), so its lanes and dependents only learn the later
// end; their entries in the heap are checked again when popped.
void Engine::MoveEnd(int op, double end) {
  if (end <= timing_[op].end) return;
  timing_[op].end = end;
  for (const Where& w : where_[op]) {
    if (lane_last_[w.lane] == op) lane_free_[w.lane] = end;
  }
  for (int d : dependents_[op]) {
    if (end >= deps_end_[d]) {
      deps_end_[d] = end;
      dep_pred_[d] = op;
    }
  }
}

void Engine::Schedule(int op) {
  const double start = Start(op);
  timing_[op] = {start, start, Pred(op, start), costs_[op].algorithm};
  done_[op] = 1;
  const double end = EndOf(op, start);
  timing_[op].end = end;
  for (const Where& w : where_[op]) Occupy(w, op, end);
  for (int d : dependents_[op]) {
    --missing_[d];
    if (end >= deps_end_[d]) {
      deps_end_[d] = end;
      dep_pred_[d] = op;
    }
    if (missing_[d] == 0) TryPush(d);
  }
  for (const Where& w : where_[op]) LaneMoved(w.lane);
}

void Engine::LaneMoved(int lane) {
  const std::vector<std::vector<int>>& blocks = lanes_[lane].blocks;
  if (lane_block_[lane] >= 0) {
    TryPush(blocks[lane_block_[lane]][lane_pos_[lane]]);
    return;
  }
  if (lanes_[lane].order == LaneOrder::kInOrder) {
    while (lane_next_[lane] < static_cast<int>(blocks.size()) && blocks[lane_next_[lane]].empty()) ++lane_next_[lane];
    if (lane_next_[lane] < static_cast<int>(blocks.size())) TryPush(blocks[lane_next_[lane]][0]);
    return;
  }
  std::vector<int> waiting;
  waiting.swap(waiting_[lane]);
  for (int op : waiting) {
    if (waiting_on_[op] == lane) waiting_on_[op] = -1;
  }
  for (int op : waiting) TryPush(op);
}

absl::Status Engine::Run() {
  for (size_t op = 0; op < p_.ops.size(); ++op) {
    if (missing_[op] == 0) TryPush(static_cast<int>(op));
  }
  size_t scheduled = 0;
  while (!heap_.empty()) {
    const auto [key, ready, op] = heap_.top();
    heap_.pop();
    queued_[op] = 0;
    if (!Eligible(op)) continue;
    const double start = Start(op);
    if (start > key) {
      heap_.emplace(start, deps_end_[op], op);
      queued_[op] = 1;
      continue;
    }
    Schedule(op);
    ++scheduled;
  }
  if (scheduled == p_.ops.size()) return absl::OkStatus();
  for (size_t op = 0; op < p_.ops.size(); ++op) {
    if (!done_[op]) {
      return absl::InvalidArgumentError(absl::StrCat("step program deadlocks: op ", op, " (", p_.ops[op].label,
                                                     ") never starts; its lanes or dependencies wait in a cycle"));
    }
  }
  return absl::InternalError("step program: ops left unscheduled");
}

bool SharedCollective(const StepProgram& p, const StepOp& op) {
  return IsCollective(op.kind) && p.groups[op.group].size() > 1;
}

// Whether all of a rank's collectives run on one lane of its own (the
// sequential schedule's caller thread): they run one at a time already.
std::vector<char> Serialised(const StepProgram& p) {
  std::vector<int> member_of(p.world_size, 0), on_lane(p.world_size, 0), lane_of(p.world_size, -1);
  for (const StepOp& op : p.ops) {
    if (!SharedCollective(p, op)) continue;
    for (int r : p.groups[op.group]) ++member_of[r];
  }
  for (size_t l = 0; l < p.lanes.size(); ++l) {
    for (const std::vector<int>& block : p.lanes[l].blocks) {
      for (int op : block) {
        if (!SharedCollective(p, p.ops[op])) continue;
        for (int r : p.lanes[l].ranks) {
          ++on_lane[r];
          lane_of[r] = lane_of[r] == -1 || lane_of[r] == static_cast<int>(l) ? static_cast<int>(l) : -2;
        }
      }
    }
  }
  std::vector<char> serialised(p.world_size, 0);
  for (int r = 0; r < p.world_size; ++r) serialised[r] = lane_of[r] >= 0 && on_lane[r] == member_of[r];
  return serialised;
}

// The simulator's own lanes: per rank and link class one as-ready lane that
// each collective over that link occupies on each member, so that a rank's
// collectives on one link run one at a time (two groups' comm lanes would
// otherwise each get the whole link). For transfers bound by bandwidth this
// ends a set of collectives when fair sharing would. Ranks whose collectives
// run one at a time already get none.
std::vector<Lane> WithLinkLanes(const StepProgram& p, const std::vector<GroupShape>& shapes) {
  std::vector<Lane> lanes = p.lanes;
  const std::vector<char> serialised = Serialised(p);
  std::vector<std::array<int, kLinkClassCount>> link(p.world_size, {-1, -1});
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const StepOp& op = p.ops[i];
    if (!SharedCollective(p, op)) continue;
    const GroupShape& shape = shapes[op.group];
    const std::array<bool, kLinkClassCount> uses = {shape.per_node > 1, shape.nodes > 1};
    for (int rank : p.groups[op.group]) {
      if (serialised[rank]) continue;
      for (int c = 0; c < kLinkClassCount; ++c) {
        if (!uses[c]) continue;
        if (link[rank][c] < 0) {
          link[rank][c] = static_cast<int>(lanes.size());
          lanes.push_back({LinkClassName(static_cast<LinkClass>(c)), {rank}, LaneOrder::kAsReady, {}});
        }
        lanes[link[rank][c]].blocks.push_back({static_cast<int>(i)});
      }
    }
  }
  return lanes;
}

// ---- per rank and the critical path

void BookCollective(const StepProgram& p, const StepOp& op, const OpCost& cost, size_t member, RankResult& r) {
  if (p.groups[op.group].size() < 2) return;
  if (HasMemberBytes(op)) {
    r.p2p_sent_bytes += MemberBytes(op.member_send, member);
    r.p2p_recv_bytes += MemberBytes(op.member_recv, member);
  } else {
    r.collective_bytes[static_cast<int>(op.kind)] += op.bytes;
  }
  if (cost.sent.empty()) return;
  const std::array<double, kLinkClassCount>& sent = SentRow(cost, member);
  for (int c = 0; c < kLinkClassCount; ++c) r.wire_bytes[c] += sent[c];
}

std::vector<RankResult> PerRank(const ClusterSpec& c, const StepProgram& p, const std::vector<OpCost>& costs,
                                const std::vector<OpTiming>& timing) {
  std::vector<RankResult> ranks(p.world_size);
  for (int r = 0; r < p.world_size; ++r) {
    ranks[r].rank = r;
    ranks[r].node = NodeOf(c, r);
  }
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const StepOp& op = p.ops[i];
    const double seconds = timing[i].end - timing[i].start;
    const absl::Span<const int> members =
        IsCollective(op.kind) ? absl::Span<const int>(p.groups[op.group]) : absl::Span<const int>(&op.rank, 1);
    for (size_t m = 0; m < members.size(); ++m) {
      RankResult& r = ranks[members[m]];
      r.busy_seconds[static_cast<int>(op.phase)] += seconds;
      r.finish_seconds = std::max(r.finish_seconds, timing[i].end);
      if (IsCollective(op.kind)) BookCollective(p, op, costs[i], m, r);
    }
  }
  return ranks;
}

void FindCriticalPath(StepResult& result) {
  int last = -1;
  for (size_t i = 0; i < result.timing.size(); ++i) {
    if (last < 0 || result.timing[i].end > result.timing[last].end) last = static_cast<int>(i);
  }
  for (int op = last; op >= 0; op = result.timing[op].pred) {
    result.critical_path.push_back(op);
    const int phase = static_cast<int>(result.program.ops[op].phase);
    result.critical_seconds[phase] += result.timing[op].end - result.timing[op].start;
  }
  std::reverse(result.critical_path.begin(), result.critical_path.end());
  int best = 0;
  for (int ph = 1; ph < kPhaseCount; ++ph) {
    if (result.critical_seconds[ph] > result.critical_seconds[best]) best = ph;
  }
  result.critical_phase = static_cast<Phase>(best);
}

}  // namespace

absl::StatusOr<StepResult> RunStepProgram(StepProgram program, const ClusterSpec& cluster) {
  MUONSHARD_RETURN_IF_ERROR(ValidateProgram(program));
  MUONSHARD_RETURN_IF_ERROR(ValidateCluster(cluster));
  MUONSHARD_RETURN_IF_ERROR(CheckWorldFits(cluster, program.world_size));
  std::vector<GroupShape> shapes;
  shapes.reserve(program.groups.size());
  if (program.gpus_per_node > 0 && program.gpus_per_node != cluster.gpus_per_node) {
    return absl::InvalidArgumentError(absl::StrCat("the plan's topology.gpus_per_node is ", program.gpus_per_node,
                                                   ", the cluster's gpus_per_node ", cluster.gpus_per_node,
                                                   ": plan for the cluster's nodes (--gpus-per-node ",
                                                   cluster.gpus_per_node, "), or give the cluster the plan's"));
  }
  for (const std::vector<int>& g : program.groups) shapes.push_back(ShapeOf(cluster, g, program.gpus_per_node));
  std::vector<OpCost> costs;
  costs.reserve(program.ops.size());
  for (const StepOp& op : program.ops) costs.push_back(CostOf(cluster, program, shapes, op));
  PriceGroupCalls(cluster, program, costs);
  const std::vector<Lane> lanes = WithLinkLanes(program, shapes);
  Contention contention(program, cluster, costs);
  Engine engine(program, lanes, costs, contention);
  MUONSHARD_RETURN_IF_ERROR(engine.Run());
  StepResult result;
  result.timing = std::move(engine.timing());
  result.ranks = PerRank(cluster, program, costs, result.timing);
  for (const RankResult& r : result.ranks) {
    if (r.finish_seconds > result.step_seconds) {
      result.step_seconds = r.finish_seconds;
      result.critical_rank = r.rank;
    }
  }
  result.program = std::move(program);
  FindCriticalPath(result);
  return result;
}

}  // namespace muonshard::sim
