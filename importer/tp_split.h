#ifndef MUONSHARD_IMPORTER_TP_SPLIT_H_
#define MUONSHARD_IMPORTER_TP_SPLIT_H_

// Marks a manifest's tensors with the tensor-parallel splits Megatron-LM and
// Paddle use for decoder models (TensorSpec.tp_split), by the module name in
// the HF parameter name. Pure.
//
//   TP_COLUMN  q_proj k_proj v_proj qkv_proj q_b_proj kv_b_proj gate_proj up_proj
//              gate_up_proj w1 w3, GPT-NeoX / Falcon query_key_value and
//              dense_h_to_4h (weight and bias), embed_tokens, embed_in,
//              word_embeddings (vocab), lm_head, embed_out and the MTP
//              shared_head.head (vocab)
//   TP_ROW     o_proj down_proj w2, dense_4h_to_h, attention.dense and
//              self_attention.dense (weight; their bias stays replicated)
//   replicated everything else: norms, routers, MLA's q_a_proj and
//              kv_a_proj_with_mqa, MTP's eh_proj, correction biases, sinks
//
// Expert tensors (per-expert, or fused stacks) stay replicated unless
// `split_experts`: Paddle spreads experts whole over the tp ranks under
// expert parallelism (expert_tensor_parallel_degree <= 1), and the planner
// refuses split experts with ep > 1.

#include "absl/status/status.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::importer {

struct TpSplitOptions {
  int tp = 1;
  bool split_experts = false;
  // A tensor already marked (tp_split set) keeps its mark: the caller's own
  // choice for a module the rules do not know.
  bool keep_marked = false;
  // The shapes are one tp rank's shards (a tensor-parallel program's
  // parameters): each split tensor's split dimension is multiplied by tp,
  // giving the whole tensor the planner wants.
  bool shard_shapes = false;
};

// Sets tp_split on every tensor (TP_REPLICATED where no rule applies).
// INVALID_ARGUMENT, naming the tensor, when tp < 1, a split dimension is
// not divisible by tp, or a row split is asked of a 1-D tensor; the manifest
// is unchanged then.
absl::Status MarkTensorParallel(const TpSplitOptions& options, v1::ModelManifest* manifest);

}  // namespace muonshard::importer

#endif  // MUONSHARD_IMPORTER_TP_SPLIT_H_
