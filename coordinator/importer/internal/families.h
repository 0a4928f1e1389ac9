#ifndef MUONSHARD_COORDINATOR_IMPORTER_INTERNAL_FAMILIES_H_
#define MUONSHARD_COORDINATOR_IMPORTER_INTERNAL_FAMILIES_H_

// One builder per model family. Each reads the fields its HuggingFace config
// class reads (with that class's defaults for optional ones) before appending
// anything, then appends the model's tensors in `named_parameters()` order.
// `mtp` asks for the next-n prediction layers; hf_import.cc only passes true
// to families whose checkpoints have them.

#include "absl/status/status.h"
#include "coordinator/importer/internal/blocks.h"
#include "coordinator/importer/internal/hf_config.h"

namespace muonshard::importer::internal {

using FamilyBuilder = absl::Status (*)(const HfConfig& config, bool mtp, TensorList* out);

// LlamaForCausalLM.
absl::Status BuildLlama(const HfConfig& config, bool mtp, TensorList* out);
// MixtralForCausalLM (checkpoint names: block_sparse_moe, experts.E.w1/w2/w3).
absl::Status BuildMixtral(const HfConfig& config, bool mtp, TensorList* out);
// Qwen3MoeForCausalLM.
absl::Status BuildQwen3Moe(const HfConfig& config, bool mtp, TensorList* out);
// DeepseekV3ForCausalLM; also Kimi-K2 (model_type kimi_k2, same modules).
absl::Status BuildDeepseekV3(const HfConfig& config, bool mtp, TensorList* out);
// Ernie4_5_MoeForCausalLM (-PT checkpoints).
absl::Status BuildErnie45Moe(const HfConfig& config, bool mtp, TensorList* out);
// GptOssForCausalLM (bf16 names: fused 3-D expert tensors, biases, sinks).
absl::Status BuildGptOss(const HfConfig& config, bool mtp, TensorList* out);

}  // namespace muonshard::importer::internal

#endif  // MUONSHARD_COORDINATOR_IMPORTER_INTERNAL_FAMILIES_H_
