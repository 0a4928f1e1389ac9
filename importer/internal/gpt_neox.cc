// GPT-NeoX (Pythia, GPT-NeoX-20B; GPTNeoXForCausalLM), named as the
// checkpoints name it: gpt_neox.embed_in; per layer, in GPTNeoXLayer's
// definition order, input_layernorm and post_attention_layernorm (LayerNorm:
// weight and bias), attention.query_key_value and attention.dense (biases
// with attention_bias, the default), mlp.dense_h_to_4h and mlp.dense_4h_to_h
// (always biased); gpt_neox.final_layer_norm; embed_out unless tied.
// query_key_value fuses the heads' q, k and v rows head by head
// (GPTNeoXAttention views its output as [heads, 3 x head_size]): rows
// [q_h, k_h, v_h] for each head h, so Newton-Schulz runs per head and per
// q/k/v (ns_blocks rows [d, d, d] x heads).
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {
namespace {

struct NeoxSpec {
  DecoderDims dims;
  int64_t heads = 0;
  int64_t intermediate = 0;
  bool attention_bias = true;
};

void AddLayerNorm(const std::string& name, int64_t hidden, TensorList* out) {
  out->Add(name + ".weight", {hidden});
  out->Add(name + ".bias", {hidden});
}

void AddNeoxLayer(const std::string& prefix, const NeoxSpec& spec, TensorList* out) {
  const int64_t h = spec.dims.hidden;
  const int64_t head_size = h / spec.heads;
  AddLayerNorm(prefix + "input_layernorm", h, out);
  AddLayerNorm(prefix + "post_attention_layernorm", h, out);
  SetNsBlocks(out->Add(prefix + "attention.query_key_value.weight", {3 * h, h}), v1::NsBlocks::ROWS,
              {head_size, head_size, head_size}, spec.heads);
  if (spec.attention_bias) out->Add(prefix + "attention.query_key_value.bias", {3 * h});
  out->AddLinear(prefix + "attention.dense", h, h, spec.attention_bias);
  out->AddLinear(prefix + "mlp.dense_h_to_4h", spec.intermediate, h, /*bias=*/true);
  out->AddLinear(prefix + "mlp.dense_4h_to_h", h, spec.intermediate, /*bias=*/true);
}

}  // namespace

absl::Status BuildGptNeox(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  NeoxSpec spec;
  MUONSHARD_ASSIGN_OR_RETURN(spec.dims, ReadDecoderDims(config, /*tie_default=*/false));
  MUONSHARD_ASSIGN_OR_RETURN(spec.heads, config.Int("num_attention_heads", kCountRange));
  if (spec.dims.hidden % spec.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: hidden_size ", spec.dims.hidden,
                                                   " is not divisible by num_attention_heads ", spec.heads));
  }
  MUONSHARD_ASSIGN_OR_RETURN(spec.intermediate, config.Int("intermediate_size", kDimRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.attention_bias, config.BoolOr("attention_bias", true));

  out->Add("gpt_neox.embed_in.weight", {spec.dims.vocab, spec.dims.hidden});
  for (int64_t layer = 0; layer < spec.dims.layers; ++layer) {
    AddNeoxLayer(absl::StrCat("gpt_neox.layers.", layer, "."), spec, out);
  }
  AddLayerNorm("gpt_neox.final_layer_norm", spec.dims.hidden, out);
  if (!spec.dims.tie_embeddings) out->Add("embed_out.weight", {spec.dims.vocab, spec.dims.hidden});
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
