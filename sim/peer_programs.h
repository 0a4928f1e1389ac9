#ifndef MUONSHARD_SIM_PEER_PROGRAMS_H_
#define MUONSHARD_SIM_PEER_PROGRAMS_H_

// The peers' optimizer steps as step programs (sim/step_program.h): other
// producers of the programs muonshard's plan produces (sim/plan_program.h),
// run by the same simulator on the same cluster. Each takes the model, the
// topology and the groups from a muonshard plan of the job -- its tensors
// (shapes, dtypes, Muon or AdamW, the TP shard a rank holds), its DEFAULT
// and MOE_EXPERT groups (the data-parallel groups a peer shards over) and
// its TENSOR_PARALLEL groups -- and ignores its buckets and owners. Every
// peer ends the step as muonshard does: every rank holds its updated
// parameters. Sizes: gradients in the plan's grad dtype, parameters in
// their own, TP exchanges in fp32 (docs/simulator.md, "The peers").
//
//   megatron-duplicated    Megatron-LM LayerWiseDistributedOptimizer
//   megatron-distributed   (megatron/core/optimizer/layer_wise_optimizer.py):
//   megatron-blockwise     gradients reduce-scattered over DP (the
//   megatron-layer-sharded layer-wise buffer layout), whole tensors assigned
//                          to DP ranks (largest first, least loaded), the
//                          owner updates them, parameters all-gathered.
//                          TP-split matrices by
//                          --muon-tp-mode (megatron/core/optimizer/muon.py,
//                          emerging_optimizers' TensorParallelMuon):
//                          duplicated all-gathers the shards and runs NS on
//                          every TP rank; distributed runs each NS iteration
//                          on the shard with an all-reduce of the Gram
//                          matrix; blockwise (the default) orthogonalises
//                          the shard alone (not the same update); layer_sharded
//                          (PR #6683) gives each matrix one NS home in the TP
//                          group, a fused all-to-all there and back.
//   kj-round-robin         KellerJordan/Muon muon.py (MuonWithAuxAdam.step):
//                          gradients all-reduced (DDP), Muon parameters by
//                          size (descending), rounds of one matrix per rank,
//                          each round's parameters all-gathered; AdamW on
//                          every rank.
//   dion-all-to-all        microsoft/dion dion/muon.py (torchtitan's copy:
//                          torchtitan/experiments/dion_optimizer/muon.py,
//                          muon_update_batch_async): FSDP2 reduce-scatter,
//                          batches of one same-shape matrix per rank
//                          assembled by a bf16 all-to-all, NS on its home,
//                          all-to-all back, FSDP all-gather; communication
//                          overlapped with NS (its async runtime).
//   zero1-muon             DeepSpeed ZeRO stage 1 (deepspeed/runtime/zero/
//                          stage_1_and_2.py, get_flat_partition): gradients
//                          all-reduced, flat partitions of the Muon and the
//                          AdamW parameters, every rank orthogonalises each
//                          whole matrix its partition touches, parameters
//                          all-gathered.
//
// Paddle's seed (greedy 2-D, reduce / broadcast) is muonshard's seed plan
// run sequentially, one Newton-Schulz call per parameter:
// BuildPaddleSeedProgram.
//
// Pure.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "muonshard/v1/plan.pb.h"
#include "sim/step_program.h"

namespace muonshard::sim {

enum class PeerStrategy {
  kMegatronDuplicated,
  kMegatronDistributed,
  kMegatronBlockwise,
  kMegatronLayerSharded,
  kRoundRobinAllGather,
  kAllToAll,
  kZero1,
};

// "megatron-duplicated", ..., "kj-round-robin", "dion-all-to-all", "zero1-muon".
const char* PeerStrategyName(PeerStrategy strategy);
// Whether the strategy's update is Muon's on a job of tensor-parallel degree
// `tp`: it orthogonalises whole matrices. megatron-blockwise never does with
// tp > 1, nor do the peers that know nothing of TP (kj-round-robin,
// dion-all-to-all, zero1-muon: each TP shard is orthogonalised as if it were
// the matrix); comparisons leave them out of the best peer.
bool OrthogonalisesWholeMatrices(PeerStrategy strategy, int tp);
// Every strategy, in the order above.
std::vector<PeerStrategy> AllPeerStrategies();
// INVALID_ARGUMENT naming the known names.
absl::StatusOr<PeerStrategy> ParsePeerStrategy(absl::string_view name);

// The strategy's step on the job of `plan` (any policy: only its tensors,
// topology and groups are read). INVALID_ARGUMENT on a plan whose parts name
// groups it lacks, or whose TP ranks hold different tensors.
absl::StatusOr<StepProgram> BuildPeerProgram(const v1::Plan& plan, PeerStrategy strategy);

// Paddle's seed: `seed_plan` (policy SEED) as the sequential step, named
// "paddle seed". INVALID_ARGUMENT for another policy.
absl::StatusOr<StepProgram> BuildPaddleSeedProgram(const v1::Plan& seed_plan);

}  // namespace muonshard::sim

#endif  // MUONSHARD_SIM_PEER_PROGRAMS_H_
