// The event simulation of step programs (sim/simulator.h) on hand-made
// programs whose ops take fixed times.
#include "sim/simulator.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/step_program.h"
#include "tests/testing/status_matchers.h"

namespace muonshard::sim {
namespace {

using ::muonshard::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

ClusterSpec Cluster() {
  ClusterSpec c;
  c.name = "test";
  c.gpus_per_node = 8;
  c.intra_node = {1, 1.0, 0};  // 1 GB/s, no latency
  c.inter_node = {1, 1.0, 0};
  c.algorithm = Algorithm::kRing;
  c.gemm_tflops = 1;
  c.ns_efficiency = {{1, 1.0}};
  c.hbm_gb_s = 1;
  return c;
}

// A program of `world` ranks, and ops that take `seconds` on `rank`.
struct Maker {
  StepProgram p;
  explicit Maker(int world) {
    p.name = "test";
    p.world_size = world;
  }
  int Lane(LaneOrder order, std::vector<int> ranks = {0}) { return p.AddLane({"lane", std::move(ranks), order, {}}); }
  int Fixed(double seconds, std::vector<int> deps = {}, Phase phase = Phase::kOther, int rank = 0) {
    StepOp op;
    op.kind = OpKind::kFixed;
    op.phase = phase;
    op.rank = rank;
    op.seconds = seconds;
    op.deps = std::move(deps);
    op.label = "op " + std::to_string(p.ops.size());
    return p.AddOp(std::move(op));
  }
  // A reduce of `bytes` over `group` to its member `root`.
  int Reduce(int group, int root, int64_t bytes = 1'000'000'000) {
    StepOp op;
    op.kind = OpKind::kReduce;
    op.phase = Phase::kReduce;
    op.group = group;
    op.root = root;
    op.bytes = bytes;
    return p.AddOp(std::move(op));
  }
  StepResult Run() {
    absl::StatusOr<StepResult> r = RunStepProgram(p, Cluster());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : StepResult{};
  }
};

TEST(SimulatorTest, InOrderLaneRunsItsBlocksInOrder) {
  Maker m(1);
  const int lane = m.Lane(LaneOrder::kInOrder);
  const int a = m.Fixed(1), b = m.Fixed(2);
  m.p.Append(lane, a, true);
  m.p.Append(lane, b, true);
  const StepResult r = m.Run();
  EXPECT_EQ(r.timing[b].start, 1);
  EXPECT_EQ(r.timing[b].end, 3);
  EXPECT_EQ(r.step_seconds, 3);
  EXPECT_EQ(r.ranks[0].finish_seconds, 3);
}

TEST(SimulatorTest, AsReadyLaneTakesWhatIsReadyFirst) {
  // Two "reduces" on an in-order comm lane; their updates on an as-ready
  // compute lane, listed in the other order: the first reduced goes first.
  Maker m(1);
  const int comm = m.Lane(LaneOrder::kInOrder), compute = m.Lane(LaneOrder::kAsReady);
  const int r1 = m.Fixed(1), r2 = m.Fixed(1);
  const int u2 = m.Fixed(1, {r2}), u1 = m.Fixed(3, {r1});
  for (int op : {r1, r2}) m.p.Append(comm, op, true);
  for (int op : {u2, u1}) m.p.Append(compute, op, true);
  StepResult r = m.Run();
  EXPECT_EQ(r.timing[u1].start, 1);
  EXPECT_EQ(r.timing[u2].start, 4);
  EXPECT_EQ(r.step_seconds, 5);
  // In order, u2 (ready at 2) would have gone first: 2..3, then u1 3..6.
  m.p.lanes[compute].order = LaneOrder::kInOrder;
  r = m.Run();
  EXPECT_EQ(r.timing[u1].start, 3);
  EXPECT_EQ(r.step_seconds, 6);
}

TEST(SimulatorTest, ABlockRunsBackToBack) {
  // Block X = [x1, x2], x2 waiting for e (another lane, ends at 3); block Y
  // is ready at 0 too but may not slip in between x1 and x2.
  Maker m(1);
  const int other = m.Lane(LaneOrder::kInOrder), compute = m.Lane(LaneOrder::kAsReady);
  const int e = m.Fixed(3);
  const int x1 = m.Fixed(1), x2 = m.Fixed(1, {e}), y = m.Fixed(1);
  m.p.Append(other, e, true);
  m.p.Append(compute, x1, true);
  m.p.Append(compute, x2, false);
  m.p.Append(compute, y, true);
  const StepResult r = m.Run();
  EXPECT_EQ(r.timing[x1].start, 0);
  EXPECT_EQ(r.timing[x2].start, 3);
  EXPECT_EQ(r.timing[y].start, 4);
}

TEST(SimulatorTest, AnOpOnSeveralLanesWaitsForAll) {
  Maker m(2);
  const int l0 = m.Lane(LaneOrder::kInOrder, {0}), l1 = m.Lane(LaneOrder::kInOrder, {1});
  const int a = m.Fixed(2), c = m.Fixed(1);
  m.p.Append(l0, a, true);
  m.p.Append(l0, c, true);
  m.p.Append(l1, c, true);
  const StepResult r = m.Run();
  EXPECT_EQ(r.timing[c].start, 2);
  EXPECT_EQ(r.timing[c].pred, a);
}

TEST(SimulatorTest, ACycleOfLanesIsReported) {
  Maker m(2);
  const int l0 = m.Lane(LaneOrder::kInOrder, {0}), l1 = m.Lane(LaneOrder::kInOrder, {1});
  const int a = m.Fixed(1), b = m.Fixed(1);
  m.p.Append(l0, a, true);
  m.p.Append(l0, b, true);
  m.p.Append(l1, b, true);
  m.p.Append(l1, a, true);
  EXPECT_THAT(RunStepProgram(m.p, Cluster()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("deadlocks: op 0 (op 0) never starts")));
}

TEST(SimulatorTest, CriticalPathFollowsWhatSetEachStart) {
  Maker m(1);
  const int l0 = m.Lane(LaneOrder::kInOrder), l1 = m.Lane(LaneOrder::kInOrder), l2 = m.Lane(LaneOrder::kInOrder);
  const int a = m.Fixed(1, {}, Phase::kReduce);
  const int b = m.Fixed(2, {a}, Phase::kNewtonSchulz);
  const int c = m.Fixed(0.5, {}, Phase::kSync);
  m.p.Append(l0, a, true);
  m.p.Append(l1, b, true);
  m.p.Append(l2, c, true);
  const StepResult r = m.Run();
  EXPECT_THAT(r.critical_path, ElementsAre(a, b));
  EXPECT_EQ(r.critical_phase, Phase::kNewtonSchulz);
  EXPECT_EQ(r.critical_seconds[static_cast<int>(Phase::kReduce)], 1);
  EXPECT_EQ(r.ranks[0].busy_seconds[static_cast<int>(Phase::kSync)], 0.5);
}

TEST(SimulatorTest, CollectivesBookTheirBytesOnEveryMember) {
  Maker m(2);
  m.p.groups = {{0, 1}};
  const int lane = m.Lane(LaneOrder::kInOrder, {0, 1});
  m.p.Append(lane, m.Reduce(0, 0), true);
  const StepResult r = m.Run();
  EXPECT_DOUBLE_EQ(r.step_seconds, 1 + 0.0);  // (n-1) x 0 latency + S / 1 GB/s
  for (const RankResult& rank : r.ranks) {
    EXPECT_EQ(rank.collective_bytes[static_cast<int>(OpKind::kReduce)], 1'000'000'000);
    EXPECT_DOUBLE_EQ(rank.wire_bytes[0], 5e8);  // (n-1)/n S on average
    EXPECT_EQ(rank.wire_bytes[1], 0);
  }
}

TEST(SimulatorTest, ARanksCollectivesShareItsLink) {
  // Two groups of the same two ranks, each collective on its own comm lane:
  // 1 s alone each, and one at a time on the ranks' link.
  Maker m(2);
  m.p.groups = {{0, 1}, {0, 1}};
  std::vector<int> reduces;
  for (int g = 0; g < 2; ++g) {
    const int lane = m.Lane(LaneOrder::kInOrder, {0, 1});
    reduces.push_back(m.Reduce(g, 0));
    m.p.Append(lane, reduces.back(), true);
  }
  const StepResult r = m.Run();
  EXPECT_DOUBLE_EQ(r.step_seconds, 2);
  EXPECT_EQ(r.timing[reduces[0]].start, 0);
  EXPECT_EQ(r.timing[reduces[1]].start, 1);
  EXPECT_EQ(r.timing[reduces[1]].pred, reduces[0]);
  EXPECT_EQ(r.program.lanes.size(), 2u);  // the link lanes stay the simulator's
}

TEST(SimulatorTest, GatherWithMemberBytesIsPricedByTheRootsLinks) {
  Maker m(4);
  m.p.groups = {{0, 1, 2, 3}};
  const int lane = m.Lane(LaneOrder::kInOrder, {0, 1, 2, 3});
  StepOp gather;
  gather.kind = OpKind::kGather;
  gather.phase = Phase::kTpExchange;
  gather.group = 0;
  gather.root = 1;
  gather.member_send = {1'000'000'000, 0, 1'000'000'000, 1'000'000'000};
  gather.member_recv = {0, 3'000'000'000, 0, 0};
  m.p.Append(lane, m.p.AddOp(gather), true);
  const StepResult r = m.Run();
  EXPECT_DOUBLE_EQ(r.step_seconds, 3);  // the root receives 3 GB at 1 GB/s
  EXPECT_EQ(r.ranks[1].p2p_recv_bytes, 3'000'000'000);
  EXPECT_EQ(r.ranks[0].p2p_sent_bytes, 1'000'000'000);
  EXPECT_DOUBLE_EQ(r.ranks[0].wire_bytes[0], 1e9);
  EXPECT_EQ(r.ranks[1].wire_bytes[0], 0);
}

// StepOp::call_group: gathers to two roots issued as one group call. NCCL
// runs them at once: each root receives 3 GB at 1 GB/s while every member
// sends its 2 GB, 3 s for both, on the first op; Gloo one after the other.
TEST(SimulatorTest, AGroupCallOfGathersRunsAtOnceOnNcclOneByOneOnGloo) {
  for (CollectiveLibrary library : {CollectiveLibrary::kNccl, CollectiveLibrary::kGloo}) {
    Maker m(4);
    m.p.groups = {{0, 1, 2, 3}};
    const int lane = m.Lane(LaneOrder::kInOrder, {0, 1, 2, 3});
    for (int root : {1, 2}) {
      StepOp gather;
      gather.kind = OpKind::kGather;
      gather.phase = Phase::kTpExchange;
      gather.group = 0;
      gather.root = root;
      gather.call_group = 0;
      gather.member_send.assign(4, 1'000'000'000);
      gather.member_send[root] = 0;
      m.p.Append(lane, m.p.AddOp(gather), true);
    }
    ClusterSpec c = Cluster();
    c.library = library;
    absl::StatusOr<StepResult> r = RunStepProgram(m.p, c);
    ASSERT_TRUE(r.ok()) << r.status();
    const bool nccl = library == CollectiveLibrary::kNccl;
    EXPECT_DOUBLE_EQ(r->step_seconds, nccl ? 3 : 6);
    EXPECT_DOUBLE_EQ(r->timing[1].end - r->timing[1].start, nccl ? 0 : 3);
    EXPECT_EQ(r->ranks[0].p2p_sent_bytes, 2'000'000'000);
  }
}

TEST(SimulatorTest, MalformedProgramsAreRefused) {
  const auto code = absl::StatusCode::kInvalidArgument;
  Maker m(1);
  const int lane = m.Lane(LaneOrder::kInOrder);
  const int a = m.Fixed(1);
  m.Fixed(1);  // on no lane
  m.p.Append(lane, a, true);
  EXPECT_THAT(RunStepProgram(m.p, Cluster()), StatusIs(code, HasSubstr("op 1 (op 1) is on no lane")));
  m.p.Append(lane, 1, true);
  m.p.ops[1].deps = {7};
  EXPECT_THAT(RunStepProgram(m.p, Cluster()), StatusIs(code, HasSubstr("dependency 7 out of range")));
  m.p.ops[1].deps = {};
  m.p.groups = {{0, 3}};
  EXPECT_THAT(RunStepProgram(m.p, Cluster()), StatusIs(code, HasSubstr("group 0: rank 3 is out of range")));
  m.p.groups = {{0}};
  StepOp bad;
  bad.kind = OpKind::kGather;
  bad.group = 0;
  bad.root = 0;
  bad.member_send = {1, 2};
  m.p.Append(lane, m.p.AddOp(bad), true);
  EXPECT_THAT(RunStepProgram(m.p, Cluster()), StatusIs(code, HasSubstr("member bytes for 2 ranks, group has 1")));
  m.p.ops.back().member_send = {1};
  m.p.ops[0].call_group = 4;  // a fixed op
  EXPECT_THAT(RunStepProgram(m.p, Cluster()),
              StatusIs(code, HasSubstr("only gathers and scatters with member bytes join a group call")));
  m.p.ops[0].call_group = -1;
  m.p.groups = {{0}, {0}};
  m.p.ops.back().call_group = 4;
  StepOp other = m.p.ops.back();
  other.group = 1;
  m.p.Append(lane, m.p.AddOp(other), true);
  EXPECT_THAT(RunStepProgram(m.p, Cluster()), StatusIs(code, HasSubstr("group call 4 spans groups 0 and 1")));
}

// NOTE [Host CPU]: ranks 0 and 1 reduce 1 GB over a 1 GB/s link (1 s, each
// moving 0.5 GB) while rank 0 computes on a lane of its own.
struct HostCpuCase {
  Maker m{2};
  int comm, compute, reduce;
  HostCpuCase() {
    m.p.groups = {{0, 1}};
    comm = m.Lane(LaneOrder::kInOrder, {0, 1});
    compute = m.Lane(LaneOrder::kInOrder, {0});
    reduce = m.Reduce(0, 0);
  }
  StepResult Run(double host_collective_gb_s) {
    ClusterSpec c = Cluster();
    c.host_collective_gb_s = host_collective_gb_s;
    absl::StatusOr<StepResult> r = RunStepProgram(m.p, c);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : StepResult{};
  }
};

TEST(SimulatorTest, ComputeRunsInTheCpuTheCollectivesLeave) {
  HostCpuCase h;
  const int ns = h.m.Fixed(1, {}, Phase::kNewtonSchulz);
  const int after = h.m.Fixed(1, {ns});
  h.m.p.Append(h.comm, h.reduce, true);
  h.m.p.Append(h.compute, ns, true);
  h.m.p.Append(h.compute, after, true);
  // Off: the two overlap fully.
  StepResult r = h.Run(0);
  EXPECT_DOUBLE_EQ(r.timing[ns].end, 1);
  // 0.5 s of CPU over the reduce's 1 s: half the CPU for [0, 1], so 0.5 s of
  // the 1 s of compute is left at 1.
  r = h.Run(1);
  EXPECT_DOUBLE_EQ(r.timing[h.reduce].end, 1);  // collectives go first
  EXPECT_DOUBLE_EQ(r.timing[ns].end, 1.5);
  EXPECT_DOUBLE_EQ(r.timing[after].start, 1.5);
  EXPECT_EQ(r.timing[after].pred, ns);
  EXPECT_DOUBLE_EQ(r.ranks[0].busy_seconds[static_cast<int>(Phase::kNewtonSchulz)], 1.5);
  EXPECT_DOUBLE_EQ(r.step_seconds, 2.5);
  // A CPU-bound collective (2 s of CPU in 1 s) takes all of it.
  r = h.Run(0.25);
  EXPECT_DOUBLE_EQ(r.timing[ns].end, 2);
  // Rank 1 computes nothing: its step is the reduce.
  EXPECT_DOUBLE_EQ(r.ranks[1].finish_seconds, 1);
}

TEST(SimulatorTest, ACollectiveThatStartsLaterSlowsTheRunningCompute) {
  // The reduce waits 0.5 s for rank 1; rank 0's 2 s of compute started at 0
  // runs at full speed until then, at half for [0.5, 1.5], and ends at 2.5.
  HostCpuCase h;
  const int late = h.m.Fixed(0.5, {}, Phase::kOther, 1);
  const int rank1 = h.m.Lane(LaneOrder::kInOrder, {1});
  h.m.p.Append(rank1, late, true);
  h.m.p.ops[h.reduce].deps = {late};
  const int ns = h.m.Fixed(2, {}, Phase::kNewtonSchulz);
  const int after = h.m.Fixed(1, {ns});
  h.m.p.Append(h.comm, h.reduce, true);
  h.m.p.Append(h.compute, ns, true);
  const int other = h.m.Lane(LaneOrder::kInOrder, {0});
  h.m.p.Append(other, after, true);
  const StepResult r = h.Run(1);
  EXPECT_DOUBLE_EQ(r.timing[h.reduce].start, 0.5);
  EXPECT_DOUBLE_EQ(r.timing[ns].end, 2.5);
  EXPECT_DOUBLE_EQ(r.timing[after].start, 2.5);
  EXPECT_DOUBLE_EQ(r.timing[late].end, 0.5);  // ended before the reduce
  EXPECT_DOUBLE_EQ(r.step_seconds, 3.5);
}

TEST(SimulatorTest, OneThreadTakingTurnsIsNotSlowedByTheHostCpu) {
  // The sequential schedule: the reduce, then the compute, on one lane.
  HostCpuCase h;
  const int ns = h.m.Fixed(1, {}, Phase::kNewtonSchulz);
  h.m.p.Append(h.comm, h.reduce, true);
  h.m.p.Append(h.comm, ns, true);
  for (double host : {0.0, 1.0, 0.25}) {
    const StepResult r = h.Run(host);
    EXPECT_DOUBLE_EQ(r.timing[ns].start, 1) << host;
    EXPECT_DOUBLE_EQ(r.step_seconds, 2) << host;
  }
}

// NOTE [Shared node links]: two groups of two ranks, one on each of two
// nodes, reduce 1 GB each at once over the nodes' one link (1 GB/s each way).
StepResult TwoGroupsReduceAcrossNodes(int second_root, bool shared) {
  Maker m(4);
  m.p.groups = {{0, 2}, {1, 3}};
  std::vector<int> reduces;
  for (int g = 0; g < 2; ++g) {
    const int lane = m.Lane(LaneOrder::kInOrder, m.p.groups[g]);
    m.p.Append(lane, m.Reduce(g, g == 0 ? 0 : second_root), true);
  }
  ClusterSpec c = Cluster();
  c.gpus_per_node = 2;
  c.inter_node_shared = shared;
  absl::StatusOr<StepResult> r = RunStepProgram(m.p, c);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : StepResult{};
}

TEST(SimulatorTest, CollectivesOfTwoGroupsShareANodesLinkOneWayAtATime) {
  // Both into node 0 (roots rank 0 and rank 1): one after the other.
  StepResult r = TwoGroupsReduceAcrossNodes(/*second_root=*/0, /*shared=*/true);
  EXPECT_DOUBLE_EQ(r.timing[0].end, 1);
  EXPECT_DOUBLE_EQ(r.timing[1].end, 2);
  EXPECT_DOUBLE_EQ(r.step_seconds, 2);
  // Opposite ways (the second into node 1, rank 3): both at once.
  r = TwoGroupsReduceAcrossNodes(/*second_root=*/1, /*shared=*/true);
  EXPECT_DOUBLE_EQ(r.timing[1].end, 1);
  EXPECT_DOUBLE_EQ(r.step_seconds, 1);
  // A NIC per GPU: both at once.
  r = TwoGroupsReduceAcrossNodes(/*second_root=*/0, /*shared=*/false);
  EXPECT_DOUBLE_EQ(r.step_seconds, 1);
}

TEST(SimulatorTest, ProgramMustFitTheCluster) {
  Maker m(16);
  ClusterSpec c = Cluster();
  c.nodes = 1;
  EXPECT_THAT(RunStepProgram(m.p, c), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cluster.nodes")));
}

}  // namespace
}  // namespace muonshard::sim
