#ifndef MUONSHARD_SIM_SIMULATOR_H_
#define MUONSHARD_SIM_SIMULATOR_H_

// Runs a step program (sim/step_program.h) on a cluster (sim/cluster.h):
// prices every op with the cost model (sim/cost_model.h), then plays the
// lanes as a discrete-event simulation. Every op starts as soon as its
// dependencies have ended and each of its lanes may run it (an in-order
// lane: it is next; an as-ready lane: its block is running, or the lane is
// free and the block can start before any other). All ranks start the step
// at 0 with their gradients in; a rank's step ends with its last op, the
// job's with the last rank's. A rank's link of each class carries one
// collective at a time: the simulator adds a lane per rank and link class
// that every collective over it occupies (the program's lanes do not
// change; timelines show them as they are). On CPU ranks a collective
// takes a share of its members' CPU from their compute (NOTE [Host CPU] in
// sim/cluster.h).
//
// Not modelled (docs/simulator.md): fair sharing of a link (one at a time
// instead), the backward pass the reduces could overlap, stragglers, and
// compute kernels slowing collectives down.
//
// Pure: no I/O, threads or clock.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sim/cluster.h"
#include "sim/step_program.h"

namespace muonshard::sim {

struct OpTiming {
  double start = 0;
  double end = 0;
  // The op whose end set this one's start (a dependency, or the previous op
  // on one of its lanes); -1 when it started at 0.
  int pred = -1;
  std::string algorithm;  // collectives: "ring", "nvls/ring" (intra/inter)
};

struct RankResult {
  int rank = 0;
  int node = 0;
  double finish_seconds = 0;
  // Time in ops of each phase (a collective counts for every member). Busy
  // times overlap on the pipelined schedule: their sum may exceed the step.
  std::array<double, kPhaseCount> busy_seconds{};
  // Bytes handed to each kind of collective (StepOp::bytes), as the plan's
  // RankPlan figures count them; groups of one rank count none.
  std::array<int64_t, kOpKindCount> collective_bytes{};
  // Payload of the ops with per-member bytes (TP gathers and scatters).
  int64_t p2p_sent_bytes = 0;
  int64_t p2p_recv_bytes = 0;
  // Bytes the rank sends over each link class, as the algorithms move them
  // (a symmetric collective's are its members' average).
  std::array<double, kLinkClassCount> wire_bytes{};
};

struct StepResult {
  StepProgram program;
  std::vector<OpTiming> timing;  // per op
  std::vector<RankResult> ranks;
  double step_seconds = 0;
  // The rank that finishes last (the lowest such), and the chain of ops
  // that set the step's length, in time order, with its time per phase.
  int critical_rank = 0;
  std::vector<int> critical_path;
  std::array<double, kPhaseCount> critical_seconds{};
  Phase critical_phase = Phase::kOther;
};

// INVALID_ARGUMENT for a malformed program (ValidateProgram), a bad cluster
// (ValidateCluster, CheckWorldFits) or a program whose lanes wait on each
// other in a cycle (naming an op that never starts).
absl::StatusOr<StepResult> RunStepProgram(StepProgram program, const ClusterSpec& cluster);

}  // namespace muonshard::sim

#endif  // MUONSHARD_SIM_SIMULATOR_H_
