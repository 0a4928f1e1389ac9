#ifndef MUONSHARD_IMPORTER_INTERNAL_FAMILIES_H_
#define MUONSHARD_IMPORTER_INTERNAL_FAMILIES_H_

// One builder per model family. Each reads the fields its HuggingFace config
// class reads (with that class's defaults for optional ones) before appending
// anything, then appends the model's tensors in `named_parameters()` order.
// Fused weights carry their Newton-Schulz blocks (TensorSpec.ns_blocks).

#include "absl/status/status.h"
#include "importer/internal/blocks.h"
#include "importer/internal/hf_config.h"

namespace muonshard::importer::internal {

// What an import asks of a family beyond its config (ImportOptions);
// hf_import.cc only sets a field for the families that have the part.
struct FamilyOptions {
  // The next-n prediction layers (DeepSeek-V3, Kimi-K2).
  bool mtp = false;
  // MLA's kv_b_proj orthogonalised per head: ns_blocks rows
  // [qk_nope_head_dim, v_head_dim] x heads.
  bool mla_head_blocks = false;
};

using FamilyBuilder = absl::Status (*)(const HfConfig& config, const FamilyOptions& options, TensorList* out);

// LlamaForCausalLM.
absl::Status BuildLlama(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// MistralForCausalLM.
absl::Status BuildMistral(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// Qwen2ForCausalLM (Qwen2, Qwen2.5).
absl::Status BuildQwen2(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// Gemma2ForCausalLM.
absl::Status BuildGemma2(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// Gemma3ForCausalLM (model_type gemma3_text).
absl::Status BuildGemma3Text(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// The language model of Gemma3ForConditionalGeneration (model_type gemma3):
// the text model its "text_config" describes, under the checkpoint's
// "language_model." prefix. The SigLIP vision tower and the multimodal
// projector are not imported.
absl::Status BuildGemma3(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// MixtralForCausalLM (checkpoint names: block_sparse_moe, experts.E.w1/w2/w3).
absl::Status BuildMixtral(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-MoE).
absl::Status BuildQwen2Moe(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// Qwen3MoeForCausalLM.
absl::Status BuildQwen3Moe(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// OlmoeForCausalLM.
absl::Status BuildOlmoe(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// DeepseekV3ForCausalLM; also Kimi-K2 (model_type kimi_k2, same modules).
absl::Status BuildDeepseekV3(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// Ernie4_5_MoeForCausalLM (-PT checkpoints).
absl::Status BuildErnie45Moe(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// GptOssForCausalLM (bf16 names: fused 3-D expert tensors, biases, sinks;
// gate_up_proj orthogonalised per half: gate and up alternate by column,
// ns_blocks cols stride 2).
absl::Status BuildGptOss(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// Phi3ForCausalLM (Phi-3 / 3.5 mini and medium, Phi-4-mini): fused qkv_proj
// (ns_blocks rows [q | k | v]) and gate_up_proj (rows [gate | up]).
absl::Status BuildPhi3(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// GPTNeoXForCausalLM (Pythia, GPT-NeoX-20B): query_key_value with rows
// interleaved per head (ns_blocks rows [d, d, d] x heads).
absl::Status BuildGptNeox(const HfConfig& config, const FamilyOptions& options, TensorList* out);
// FalconForCausalLM (Falcon 7B / 40B / 180B / 2, RW-1B): query_key_value
// fused as its attention splits it (per KV group, multi-query, or per head).
absl::Status BuildFalcon(const HfConfig& config, const FamilyOptions& options, TensorList* out);

}  // namespace muonshard::importer::internal

#endif  // MUONSHARD_IMPORTER_INTERNAL_FAMILIES_H_
