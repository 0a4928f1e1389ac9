#ifndef MUONSHARD_IMPORTER_INTERNAL_FAMILIES_H_
#define MUONSHARD_IMPORTER_INTERNAL_FAMILIES_H_

// One builder per model family. Each reads the fields its HuggingFace config
// class reads (with that class's defaults for optional ones) before appending
// anything, then appends the model's tensors in `named_parameters()` order.
// `mtp` asks for the next-n prediction layers; hf_import.cc only passes true
// to families whose checkpoints have them.

#include "absl/status/status.h"
#include "importer/internal/blocks.h"
#include "importer/internal/hf_config.h"

namespace muonshard::importer::internal {

using FamilyBuilder = absl::Status (*)(const HfConfig& config, bool mtp, TensorList* out);

// LlamaForCausalLM.
absl::Status BuildLlama(const HfConfig& config, bool mtp, TensorList* out);
// MistralForCausalLM.
absl::Status BuildMistral(const HfConfig& config, bool mtp, TensorList* out);
// Qwen2ForCausalLM (Qwen2, Qwen2.5).
absl::Status BuildQwen2(const HfConfig& config, bool mtp, TensorList* out);
// Gemma2ForCausalLM.
absl::Status BuildGemma2(const HfConfig& config, bool mtp, TensorList* out);
// Gemma3ForCausalLM (model_type gemma3_text).
absl::Status BuildGemma3Text(const HfConfig& config, bool mtp, TensorList* out);
// The language model of Gemma3ForConditionalGeneration (model_type gemma3):
// the text model its "text_config" describes, under the checkpoint's
// "language_model." prefix. The SigLIP vision tower and the multimodal
// projector are not imported.
absl::Status BuildGemma3(const HfConfig& config, bool mtp, TensorList* out);
// MixtralForCausalLM (checkpoint names: block_sparse_moe, experts.E.w1/w2/w3).
absl::Status BuildMixtral(const HfConfig& config, bool mtp, TensorList* out);
// Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-MoE).
absl::Status BuildQwen2Moe(const HfConfig& config, bool mtp, TensorList* out);
// Qwen3MoeForCausalLM.
absl::Status BuildQwen3Moe(const HfConfig& config, bool mtp, TensorList* out);
// OlmoeForCausalLM.
absl::Status BuildOlmoe(const HfConfig& config, bool mtp, TensorList* out);
// DeepseekV3ForCausalLM; also Kimi-K2 (model_type kimi_k2, same modules).
absl::Status BuildDeepseekV3(const HfConfig& config, bool mtp, TensorList* out);
// Ernie4_5_MoeForCausalLM (-PT checkpoints).
absl::Status BuildErnie45Moe(const HfConfig& config, bool mtp, TensorList* out);
// GptOssForCausalLM (bf16 names: fused 3-D expert tensors, biases, sinks).
absl::Status BuildGptOss(const HfConfig& config, bool mtp, TensorList* out);

}  // namespace muonshard::importer::internal

#endif  // MUONSHARD_IMPORTER_INTERNAL_FAMILIES_H_
