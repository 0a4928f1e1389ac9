#include "sim/peer_programs.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "sim/internal/peer_job.h"
#include "sim/plan_program.h"

namespace muonshard::sim {

namespace {

struct Named {
  PeerStrategy strategy;
  const char* name;
};
constexpr Named kNames[] = {
    {PeerStrategy::kMegatronDuplicated, "megatron-duplicated"},
    {PeerStrategy::kMegatronDistributed, "megatron-distributed"},
    {PeerStrategy::kMegatronBlockwise, "megatron-blockwise"},
    {PeerStrategy::kMegatronLayerSharded, "megatron-layer-sharded"},
    {PeerStrategy::kRoundRobinAllGather, "kj-round-robin"},
    {PeerStrategy::kAllToAll, "dion-all-to-all"},
    {PeerStrategy::kZero1, "zero1-muon"},
};

}  // namespace

const char* PeerStrategyName(PeerStrategy strategy) {
  for (const Named& n : kNames) {
    if (n.strategy == strategy) return n.name;
  }
  return "?";
}

bool OrthogonalisesWholeMatrices(PeerStrategy strategy, int tp) {
  if (tp <= 1) return true;
  return strategy == PeerStrategy::kMegatronDuplicated || strategy == PeerStrategy::kMegatronDistributed ||
         strategy == PeerStrategy::kMegatronLayerSharded;
}

std::vector<PeerStrategy> AllPeerStrategies() {
  std::vector<PeerStrategy> all;
  for (const Named& n : kNames) all.push_back(n.strategy);
  return all;
}

absl::StatusOr<PeerStrategy> ParsePeerStrategy(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  std::vector<std::string> known;
  for (const Named& n : kNames) {
    if (lower == n.name) return n.strategy;
    known.emplace_back(n.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", name, "\" is not a peer strategy (", absl::StrJoin(known, ", "), ")"));
}

absl::StatusOr<StepProgram> BuildPeerProgram(const v1::Plan& plan, PeerStrategy strategy) {
  MUONSHARD_ASSIGN_OR_RETURN(const internal::Job job, internal::JobOf(plan));
  switch (strategy) {
    case PeerStrategy::kMegatronDuplicated:
    case PeerStrategy::kMegatronDistributed:
    case PeerStrategy::kMegatronBlockwise:
    case PeerStrategy::kMegatronLayerSharded:
      return internal::BuildMegatronProgram(job, strategy);
    case PeerStrategy::kRoundRobinAllGather:
      return internal::BuildRoundRobinProgram(job);
    case PeerStrategy::kAllToAll:
      return internal::BuildAllToAllProgram(job);
    case PeerStrategy::kZero1:
      return internal::BuildZero1Program(job);
  }
  return absl::InvalidArgumentError("unknown peer strategy");
}

absl::StatusOr<StepProgram> BuildPaddleSeedProgram(const v1::Plan& seed_plan) {
  if (seed_plan.policy().policy() != v1::SEED) {
    return absl::InvalidArgumentError(
        absl::StrCat("paddle seed: the plan's policy is ", v1::Policy_Name(seed_plan.policy().policy()), ", not SEED"));
  }
  MUONSHARD_ASSIGN_OR_RETURN(StepProgram p, BuildPlanProgram(seed_plan, Schedule::kSequential, NsCalls::kPerTensor, 0));
  p.name = "paddle seed";
  return p;
}

}  // namespace muonshard::sim