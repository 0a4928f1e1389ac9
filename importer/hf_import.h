#ifndef MUONSHARD_IMPORTER_HF_IMPORT_H_
#define MUONSHARD_IMPORTER_HF_IMPORT_H_

// The HuggingFace importer: the ModelManifest of a decoder model computed from
// its config.json alone, with the tensor names, shapes and order of the HF
// checkpoint (`named_parameters()` order: embedding, each layer's attention,
// MLP / router / experts / shared experts and two layer norms (four in
// Gemma 2 / 3), model.norm, lm_head unless tied). Pure: no I/O, no globals;
// thread-safe.
//
// Model types: llama, mistral, qwen2 (also Qwen2.5), gemma2, gemma3_text,
// gemma3, mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3, kimi_k2,
// ernie4_5_moe, gpt_oss, phi3, gpt_neox, falcon. gemma3 is the multimodal Gemma 3
// (Gemma3ForConditionalGeneration): only its language model is imported,
// from the nested "text_config" and under the checkpoint's names
// (language_model.model.*); the SigLIP vision tower and the multimodal
// projector are not imported.
//
// Fused weights carry their Newton-Schulz blocks (TensorSpec.ns_blocks;
// docs/planner.md, "Fused weights: per-block Newton-Schulz"): phi3's
// qkv_proj and gate_up_proj, gpt_neox's and falcon's query_key_value,
// gpt_oss's experts.gate_up_proj; DeepSeek-V3's / Kimi-K2's MLA kv_b_proj
// per head with ImportOptions.ns_blocks_mla.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::importer {

struct ImportOptions {
  // Add the next-n prediction (MTP) layers the checkpoint carries
  // (DeepSeek-V3 / Kimi-K2 `num_nextn_predict_layers`). INVALID_ARGUMENT for
  // a model type without them.
  bool mtp = false;
  // Orthogonalise MLA's kv_b_proj per head (DeepSeek-V3 / Kimi-K2: ns_blocks
  // rows [qk_nope_head_dim, v_head_dim] x heads). INVALID_ARGUMENT for a
  // model type without MLA.
  bool ns_blocks_mla = false;
  // Per-block Newton-Schulz by tensor-name rules, REGEX=BLOCKS
  // (ns_blocks_rules.h), applied after the family's own blocks (a rule's
  // blocks replace them).
  std::vector<std::string> ns_blocks;
  // The manifest's model name. Empty: the last path component of the
  // config's `_name_or_path`, else `default_name`, else the model_type.
  std::string name;
  std::string default_name;
};

// The manifest of the model `config_json` describes. Dtypes follow
// `torch_dtype` (or `dtype`): bfloat16 -> BF16 (the default), float16 ->
// FP16, float32 -> FP32; tensors the checkpoints keep in fp32 (routing
// correction biases, ERNIE's router) are FP32 whatever it says. Per-expert
// tensors carry `expert`; gpt-oss's fused [E, in, out] expert tensors carry
// layout IN_OUT.
//
// Possible errors, all INVALID_ARGUMENT and naming the field:
//   config.json: not a JSON object: ...
//   config.json: missing field "num_hidden_layers"
//   config.json: field "hidden_size" must be an integer, got "4k"
//   config.json: unknown model_type "foo" (supported: ...)
absl::StatusOr<v1::ModelManifest> ImportHfConfig(absl::string_view config_json, const ImportOptions& options);

// The model_type values ImportHfConfig accepts, sorted.
std::vector<std::string> SupportedModelTypes();

// True when `json` looks like a HuggingFace config.json rather than a
// manifest: a JSON object with a string "model_type" and no "tensors". Sets
// `*model_type` (when not null) to it. For messages that tell a user who
// passed a config where a manifest was wanted to run import-hf first.
bool LooksLikeHfConfig(absl::string_view json, std::string* model_type);

}  // namespace muonshard::importer

#endif  // MUONSHARD_IMPORTER_HF_IMPORT_H_
