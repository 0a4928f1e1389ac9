#ifndef MUONSHARD_IMPORTER_INTERNAL_BLOCKS_H_
#define MUONSHARD_IMPORTER_INTERNAL_BLOCKS_H_

// The building blocks every model family shares: a tensor appender, the
// decoder skeleton (embedding, layers, final norm, head) and the attention,
// MLP and expert modules, each appending its tensors with HuggingFace names
// in `named_parameters()` order (the order the modules are defined in the HF
// modeling code; a Linear yields weight, then bias).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "importer/internal/hf_config.h"
#include "muonshard/v1/manifest.pb.h"

namespace muonshard::importer::internal {

// Appends tensors to a manifest, in order, in the model dtype.
class TensorList {
 public:
  // `manifest` is not owned and must outlive this object.
  TensorList(v1::DType dtype, v1::ModelManifest* manifest) : dtype_(dtype), manifest_(manifest) {}

  // The new tensor, for the caller to set a dtype, expert or layout override
  // on; valid until the next Add.
  v1::TensorSpec* Add(std::string name, const std::vector<int64_t>& shape);
  // `name`.weight [out_features, in_features] (HF nn.Linear) and, with
  // `bias`, `name`.bias [out_features].
  void AddLinear(const std::string& name, int64_t out_features, int64_t in_features, bool bias);
  // A list appending to the same manifest, in the same dtype, with `prefix`
  // before every name (Gemma 3's "language_model." for the text model inside
  // the multimodal checkpoint).
  TensorList WithNamePrefix(absl::string_view prefix) const;

 private:
  v1::DType dtype_;
  v1::ModelManifest* manifest_;
  std::string name_prefix_;
};

// "model.layers.<layer>."
std::string LayerPrefix(int64_t layer);

// Per-block Newton-Schulz of a fused weight (TensorSpec.ns_blocks): `groups`
// groups of consecutive blocks `sizes` along `axis` (groups 1 is left unset,
// meaning 1), or `stride` interleaved blocks.
void SetNsBlocks(v1::TensorSpec* tensor, v1::NsBlocks::Axis axis, const std::vector<int64_t>& sizes,
                 int64_t groups = 1);
void SetNsBlockStride(v1::TensorSpec* tensor, v1::NsBlocks::Axis axis, int64_t stride);

// Shapes every decoder shares.
struct DecoderDims {
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t vocab = 0;
  bool tie_embeddings = false;  // no lm_head tensor
  bool head_bias = false;       // lm_head.bias (ERNIE use_bias)
};

// hidden_size, num_hidden_layers, vocab_size and tie_word_embeddings
// (`tie_default` when absent: each HF config class has its own default).
// vocab_size is required unless `vocab_default` is given (Gemma 3, whose
// published multimodal configs leave it to the class default).
absl::StatusOr<DecoderDims> ReadDecoderDims(const HfConfig& config, bool tie_default,
                                            std::optional<int64_t> vocab_default = std::nullopt);

// Appends the tensors of one part of decoder layer `layer`; `prefix` is
// LayerPrefix(layer).
using LayerPartFn = std::function<void(int64_t layer, const std::string& prefix, TensorList* out)>;

// model.embed_tokens, then per layer `attention`, `mlp` and the two layer
// norms.
void AddEmbeddingAndLayers(const DecoderDims& dims, const LayerPartFn& attention, const LayerPartFn& mlp,
                           TensorList* out);
// model.norm and, unless tied, lm_head.
void AddFinalNormAndHead(const DecoderDims& dims, TensorList* out);
// The whole decoder: AddEmbeddingAndLayers, then AddFinalNormAndHead.
void AddDecoder(const DecoderDims& dims, const LayerPartFn& attention, const LayerPartFn& mlp, TensorList* out);

// input_layernorm and post_attention_layernorm of one layer.
void AddLayerNorms(const std::string& prefix, int64_t hidden, TensorList* out);

// Grouped-query attention (Llama and the families derived from it).
struct GqaSpec {
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  bool qkv_bias = false;
  bool o_bias = false;
  bool qk_norm = false;  // Qwen3: per-head RMSNorm weights q_norm, k_norm
  bool sinks = false;    // gpt-oss: one learned attention sink per head
};

// num_attention_heads, num_key_value_heads (default: the heads) and head_dim
// (default: `head_dim_default`, else hidden / heads, which must then divide
// evenly).
absl::StatusOr<GqaSpec> ReadGqaSpec(const HfConfig& config, int64_t hidden,
                                    std::optional<int64_t> head_dim_default = std::nullopt);
void AddGqaAttention(const std::string& prefix, const GqaSpec& spec, TensorList* out);
// AddGqaAttention with `spec` as a LayerPartFn, for AddDecoder.
LayerPartFn GqaAttentionPart(GqaSpec spec);

// DeepSeek multi-head latent attention.
struct MlaSpec {
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t q_lora_rank = 0;  // 0: a plain q_proj instead of q_a/q_b
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool bias = false;  // attention_bias: q_a_proj, kv_a_proj_with_mqa, o_proj
  // kv_b_proj orthogonalised per head: ns_blocks rows
  // [qk_nope_head_dim, v_head_dim] x heads (its rows are, per head, the
  // head's k_nope then its v).
  bool kv_b_head_blocks = false;
};

absl::StatusOr<MlaSpec> ReadMlaSpec(const HfConfig& config, int64_t hidden);
void AddMlaAttention(const std::string& prefix, const MlaSpec& spec, TensorList* out);

// The SwiGLU MLP, named gate_proj/up_proj/down_proj (definition order) or,
// in Mixtral's experts, w1 (gate), w2 (down), w3 (up).
enum class MlpNaming { kGateUpDown, kW1W2W3 };

struct MlpSpec {
  int64_t hidden = 0;
  int64_t intermediate = 0;
  bool bias = false;
  MlpNaming naming = MlpNaming::kGateUpDown;
};

// The MLP under `prefix` (e.g. "model.layers.0.mlp."); `expert` marks every
// tensor as belonging to that expert.
void AddMlp(const std::string& prefix, const MlpSpec& spec, std::optional<int> expert, TensorList* out);
// AddMlp of a dense `spec` under "mlp." as a LayerPartFn, for AddDecoder.
LayerPartFn MlpPart(MlpSpec spec);
// `count` expert MLPs `prefix`0. .. `prefix`<count-1>. (prefix ends in "experts.").
void AddExperts(const std::string& prefix, int64_t count, const MlpSpec& spec, TensorList* out);

// INVALID_ARGUMENT when `layers` x `experts` would make an unreasonably large
// manifest (a guard against mistyped configs, far above any real model).
absl::Status CheckExpertBudget(int64_t layers, int64_t experts);

}  // namespace muonshard::importer::internal

#endif  // MUONSHARD_IMPORTER_INTERNAL_BLOCKS_H_
