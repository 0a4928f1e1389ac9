// Gemma 2 and Gemma 3: GQA attention (biases on all four projections with
// attention_bias; Gemma 3 adds per-head q_norm / k_norm after o_proj), a
// bias-free gate/up/down MLP and four norms per layer, in the order
// Gemma2DecoderLayer / Gemma3DecoderLayer define them: input_layernorm,
// post_attention_layernorm, pre_feedforward_layernorm,
// post_feedforward_layernorm. Embeddings are tied unless the config says
// otherwise (both config classes default to tied).
//
// The config classes default every field; the published configs always give
// hidden_size, intermediate_size and num_hidden_layers (required here), but
// the multimodal Gemma 3 ones leave vocab_size, the head counts and head_dim
// to the defaults, which are read from the class as transformers does.
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {
namespace {

// The defaults of Gemma2Config / Gemma3TextConfig for the fields below.
struct GemmaDefaults {
  int64_t vocab = 0;
  int64_t heads = 8;
  int64_t kv_heads = 4;
  int64_t head_dim = 256;
};

constexpr GemmaDefaults kGemma2Defaults{256000};
constexpr GemmaDefaults kGemma3Defaults{262208};

constexpr const char* kGemmaLayerNorms[] = {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                            "post_feedforward_layernorm"};

struct GemmaSpec {
  DecoderDims dims;
  GqaSpec attention;
  MlpSpec mlp;
};

absl::StatusOr<GqaSpec> ReadGemmaAttention(const HfConfig& config, int64_t hidden, const GemmaDefaults& defaults) {
  GqaSpec spec;
  spec.hidden = hidden;
  MUONSHARD_ASSIGN_OR_RETURN(spec.heads, config.IntOr("num_attention_heads", defaults.heads, kCountRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.kv_heads, config.IntOr("num_key_value_heads", defaults.kv_heads, kCountRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.head_dim, config.IntOr("head_dim", defaults.head_dim, kDimRange));
  MUONSHARD_ASSIGN_OR_RETURN(bool bias, config.BoolOr("attention_bias", false));
  spec.qkv_bias = spec.o_bias = bias;
  return spec;
}

absl::StatusOr<GemmaSpec> ReadGemmaSpec(const HfConfig& config, const GemmaDefaults& defaults) {
  GemmaSpec spec;
  MUONSHARD_ASSIGN_OR_RETURN(spec.dims, ReadDecoderDims(config, /*tie_default=*/true, defaults.vocab));
  MUONSHARD_ASSIGN_OR_RETURN(spec.attention, ReadGemmaAttention(config, spec.dims.hidden, defaults));
  spec.mlp.hidden = spec.dims.hidden;
  MUONSHARD_ASSIGN_OR_RETURN(spec.mlp.intermediate, config.Int("intermediate_size", kDimRange));
  return spec;
}

void AddGemmaDecoder(const GemmaSpec& spec, TensorList* out) {
  out->Add("model.embed_tokens.weight", {spec.dims.vocab, spec.dims.hidden});
  for (int64_t layer = 0; layer < spec.dims.layers; ++layer) {
    const std::string prefix = LayerPrefix(layer);
    AddGqaAttention(prefix, spec.attention, out);
    AddMlp(prefix + "mlp.", spec.mlp, {}, out);
    for (const char* norm : kGemmaLayerNorms) out->Add(prefix + norm + ".weight", {spec.dims.hidden});
  }
  AddFinalNormAndHead(spec.dims, out);
}

}  // namespace

absl::Status BuildGemma2(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(GemmaSpec spec, ReadGemmaSpec(config, kGemma2Defaults));
  AddGemmaDecoder(spec, out);
  return absl::OkStatus();
}

absl::Status BuildGemma3Text(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(GemmaSpec spec, ReadGemmaSpec(config, kGemma3Defaults));
  spec.attention.qk_norm = true;
  AddGemmaDecoder(spec, out);
  return absl::OkStatus();
}

absl::Status BuildGemma3(const HfConfig& config, const FamilyOptions& options, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(HfConfig text, config.Object("text_config"));
  TensorList language_model = out->WithNamePrefix("language_model.");
  return BuildGemma3Text(text, options, &language_model);
}

}  // namespace muonshard::importer::internal
