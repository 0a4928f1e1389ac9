// Falcon (FalconForCausalLM: Falcon-7B / 40B / 180B, Falcon2, RW-1B), named
// as the checkpoints name it: transformer.word_embeddings; per layer
// transformer.h.N. self_attention (query_key_value, dense), mlp
// (dense_h_to_4h, dense_4h_to_h; FalconLinear, biased with `bias`), then
// the layer norms FalconDecoderLayer defines (LayerNorm: weight and bias):
// post_attention_layernorm and input_layernorm without parallel_attn, else
// ln_attn and ln_mlp when num_ln_in_parallel_attn is 2 (the default of the
// new decoder architecture), else input_layernorm; transformer.ln_f;
// lm_head unless tied (FalconConfig ties by default).
//
// query_key_value fuses q, k and v as FalconAttention._split_heads splits
// them, and Newton-Schulz runs per block (ns_blocks rows):
//   new_decoder_architecture  per KV group, [the group's heads/kv_heads Q
//                             heads, K, V]: [heads/kv x d, d, d] x kv_heads
//   multi_query               [all Q heads, the one K, the one V]: [hidden, d, d]
//   otherwise                 per head [q_h, k_h, v_h]: [d, d, d] x heads
//
// The names hold no "layers.N": with pp > 1 give the tensors a stage.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "importer/internal/families.h"

namespace muonshard::importer::internal {
namespace {

struct FalconSpec {
  DecoderDims dims;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;
  bool new_arch = false;
  bool multi_query = true;
  bool parallel_attn = true;
  int64_t parallel_norms = 1;  // num_ln_in_parallel_attn
  bool bias = false;
};

absl::StatusOr<FalconSpec> ReadFalconSpec(const HfConfig& config) {
  FalconSpec spec;
  MUONSHARD_ASSIGN_OR_RETURN(spec.dims, ReadDecoderDims(config, /*tie_default=*/true));
  MUONSHARD_ASSIGN_OR_RETURN(spec.heads, config.Int("num_attention_heads", kCountRange));
  if (spec.dims.hidden % spec.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: hidden_size ", spec.dims.hidden,
                                                   " is not divisible by num_attention_heads ", spec.heads));
  }
  spec.head_dim = spec.dims.hidden / spec.heads;
  MUONSHARD_ASSIGN_OR_RETURN(spec.kv_heads, config.IntOr("num_kv_heads", spec.heads, kCountRange));
  MUONSHARD_ASSIGN_OR_RETURN(spec.new_arch, config.BoolOr("new_decoder_architecture", false));
  MUONSHARD_ASSIGN_OR_RETURN(spec.multi_query, config.BoolOr("multi_query", true));
  MUONSHARD_ASSIGN_OR_RETURN(spec.parallel_attn, config.BoolOr("parallel_attn", true));
  MUONSHARD_ASSIGN_OR_RETURN(spec.parallel_norms,
                             config.IntOr("num_ln_in_parallel_attn", spec.new_arch ? 2 : 1, {1, 2}));
  MUONSHARD_ASSIGN_OR_RETURN(spec.bias, config.BoolOr("bias", false));
  MUONSHARD_ASSIGN_OR_RETURN(spec.ffn, config.IntOr("ffn_hidden_size", 4 * spec.dims.hidden, kDimRange));
  if (spec.new_arch && spec.heads % spec.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: num_attention_heads ", spec.heads,
                                                   " is not divisible by num_kv_heads ", spec.kv_heads));
  }
  return spec;
}

// query_key_value's rows and their blocks.
void AddQueryKeyValue(const std::string& prefix, const FalconSpec& spec, TensorList* out) {
  const int64_t d = spec.head_dim;
  const int64_t h = spec.dims.hidden;
  std::vector<int64_t> sizes;
  int64_t groups = 1;
  if (spec.new_arch) {
    sizes = {spec.heads / spec.kv_heads * d, d, d};
    groups = spec.kv_heads;
  } else if (spec.multi_query) {
    sizes = {h, d, d};
  } else {
    sizes = {d, d, d};
    groups = spec.heads;
  }
  const int64_t rows = (sizes[0] + 2 * d) * groups;
  SetNsBlocks(out->Add(prefix + "query_key_value.weight", {rows, h}), v1::NsBlocks::ROWS, sizes, groups);
  if (spec.bias) out->Add(prefix + "query_key_value.bias", {rows});
}

void AddLayerNorm(const std::string& name, int64_t hidden, TensorList* out) {
  out->Add(name + ".weight", {hidden});
  out->Add(name + ".bias", {hidden});
}

void AddFalconLayer(const std::string& prefix, const FalconSpec& spec, TensorList* out) {
  const int64_t h = spec.dims.hidden;
  AddQueryKeyValue(prefix + "self_attention.", spec, out);
  out->AddLinear(prefix + "self_attention.dense", h, h, spec.bias);
  out->AddLinear(prefix + "mlp.dense_h_to_4h", spec.ffn, h, spec.bias);
  out->AddLinear(prefix + "mlp.dense_4h_to_h", h, spec.ffn, spec.bias);
  if (!spec.parallel_attn) {
    AddLayerNorm(prefix + "post_attention_layernorm", h, out);
    AddLayerNorm(prefix + "input_layernorm", h, out);
  } else if (spec.parallel_norms == 2) {
    AddLayerNorm(prefix + "ln_attn", h, out);
    AddLayerNorm(prefix + "ln_mlp", h, out);
  } else {
    AddLayerNorm(prefix + "input_layernorm", h, out);
  }
}

}  // namespace

absl::Status BuildFalcon(const HfConfig& config, const FamilyOptions& /*options*/, TensorList* out) {
  MUONSHARD_ASSIGN_OR_RETURN(FalconSpec spec, ReadFalconSpec(config));
  out->Add("transformer.word_embeddings.weight", {spec.dims.vocab, spec.dims.hidden});
  for (int64_t layer = 0; layer < spec.dims.layers; ++layer) {
    AddFalconLayer(absl::StrCat("transformer.h.", layer, "."), spec, out);
  }
  AddLayerNorm("transformer.ln_f", spec.dims.hidden, out);
  if (!spec.dims.tie_embeddings) out->Add("lm_head.weight", {spec.dims.vocab, spec.dims.hidden});
  return absl::OkStatus();
}

}  // namespace muonshard::importer::internal
